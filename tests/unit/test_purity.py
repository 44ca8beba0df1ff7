import socket
import subprocess
import sys

import pytest

from tests.unit.conftest import ImpureUnitTest


def test_a_unit_test_cannot_start_a_process() -> None:
    with pytest.raises(ImpureUnitTest):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_unit_test_cannot_open_a_connection() -> None:
    with socket.socket() as s, pytest.raises(ImpureUnitTest):
        s.connect(("127.0.0.1", 9))
    with socket.socket() as s, pytest.raises(ImpureUnitTest):
        s.bind(("127.0.0.1", 0))
