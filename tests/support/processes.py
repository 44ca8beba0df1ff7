"""Real processes the tests start: the Tansu broker, the service itself, and a fresh MariaDB database."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pymysql

from service.adapters.db.engine import upgrade_schema
from tests.support.backends import mysql_server

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "output"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MariaDbDatabase:
    """A database of its own per test run, created, migrated and dropped over a real connection."""

    def __init__(self) -> None:
        self.name = f"mm_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.server = mysql_server()

    @property
    def url(self) -> str:
        return self.server.url(self.name)

    def _admin(self) -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return self.server.connect(autocommit=True)

    def create(self, revision: str = "head") -> MariaDbDatabase:
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        upgrade_schema(self.url, revision)
        return self

    def drop(self) -> None:
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")


class TansuBroker:
    def __init__(self) -> None:
        from service.adapters.kafka.embedded_broker import EmbeddedBroker

        self._broker = EmbeddedBroker(free_port())

    @property
    def bootstrap(self) -> str:
        return self._broker.bootstrap

    def start(self) -> TansuBroker:
        self._broker.start()
        return self

    def stop(self) -> None:
        self._broker.stop()


class ServiceProcess:
    """`mao-memory <mode>` as a child process, configured only through MEMORY_* variables, in `cwd`
    (where a run without credentials shares its throwaway secret, in data/)."""

    def __init__(
        self,
        mode: str,
        env: dict[str, str],
        name: str = "service",
        cwd: Path = ROOT,
        memory_limit: int | None = None,
    ) -> None:
        """`memory_limit`: the child's RLIMIT_DATA in bytes (heap and anonymous mappings), as a pod's
        memory limit would bound it: past it, allocations fail."""
        self.mode = mode
        self.memory_limit = memory_limit
        self.cwd = cwd
        self.port = free_port()
        self.ops_port = free_port()
        self.env = {
            **os.environ,
            **env,
            "MEMORY_HTTP_PORT": str(self.port),
            "MEMORY_OPS_PORT": str(self.ops_port),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        OUTPUT.mkdir(parents=True, exist_ok=True)
        self.log_path = OUTPUT / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ops_url(self) -> str:
        return f"http://127.0.0.1:{self.ops_port}"

    def start(
        self, wait_ready: bool = True, timeout_s: float = 60.0, terminal: bool = False
    ) -> ServiceProcess:
        """`terminal`: in a process group of its own, as a shell runs a command (Ctrl-C reaches the group)."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.main", self.mode],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            start_new_session=terminal,
        )
        if self.memory_limit is not None:  # at once, while the interpreter is still starting
            limit = (self.memory_limit, self.memory_limit)
            resource.prlimit(self.process.pid, resource.RLIMIT_DATA, limit)
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def peak_rss(self) -> int:
        """The child's peak resident set so far (VmHWM), in bytes."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
        return int(line.split()[1]) * 1024

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=1.0).status_code == 200 and self._assigned():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"service not ready within {timeout_s}s; see {self.log_path}")

    def _assigned(self) -> bool:
        """A worker is ready for a test once its consumer owns partitions."""
        if self.mode == "api":
            return True
        text = httpx.get(f"{self.base_url}/metrics", timeout=1.0).text
        return "mao_memory_partitions_assigned" not in text or any(
            line.startswith("mao_memory_partitions_assigned") and not line.endswith(" 0.0")
            for line in text.splitlines()
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        return code

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for line in httpx.get(f"{self.base_url}/metrics", timeout=2.0).text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total
