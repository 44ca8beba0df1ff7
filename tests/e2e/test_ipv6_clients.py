"""The per-client bound against IPv6 clients: a host is given a /64 (a home line, a cloud VM), so each
of its addresses counting as a client of its own would leave the bound without effect. Runs in a
network namespace of its own (root and `unshare`), where loopback answers for two /64 prefixes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.adapters.db.engine import upgrade_schema
from tests.support.processes import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).with_name("ipv6_prefix_clients.py")
# Loopback up, the server's address, and every address of both prefixes bindable by a client.
NAMESPACE_SETUP = (
    "ip link set lo up && ip -6 addr add fd00::1/64 dev lo && sysctl -qw net.ipv6.ip_nonlocal_bind=1 && "
    "ip -6 route add local fd00::/64 dev lo table local && "
    "ip -6 route add local fd00:0:0:1::/64 dev lo table local"
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_the_addresses_of_one_ipv6_prefix_share_one_clients_slots(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    command = f"{NAMESPACE_SETUP} && exec {sys.executable} -m tests.e2e.ipv6_prefix_clients '{url}'"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MEMORY_LOG_LEVEL": "ERROR"}
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", command],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    # Four addresses of fd00::/64 take its four slots; the fifth and sixth are refused.
    assert answers["one_prefix"] == [200, 200, 200, 200, 503, 503]
    assert answers["other_prefix"] == 200
