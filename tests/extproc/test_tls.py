"""TLS on the ext_proc and health ports: both serve the certificate from --cert-path, a rotated
certificate reaches new connections without a restart while established streams go on, unusable new
files keep the old pair serving, and a client CA makes clients present a certificate it signed (mTLS).

Certificates are made here with `cryptography`; the cert directory is written the way the kubelet
writes a Secret volume (files behind a `..data` symlink swapped atomically). Every connection is new
(a local subchannel pool), so each check is a fresh TLS handshake.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import itertools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore
from epick.extproc.server import SERVICE_NAME, ExtProcOptions, ExtProcServer
from epick.extproc.tls import CertificateStore, TlsFileError
from epick.requestcontrol.director import Director

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LOOPBACK = ipaddress.ip_address("127.0.0.1")


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Pair:
    key: bytes
    cert: bytes


class CA:
    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = pem(self.cert)

    def issue(self, name: str = "epick", client: bool = False, dns: str = "localhost") -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(dns), x509.IPAddress(LOOPBACK)]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return Pair(key_pem(key), pem(cert))


class SecretDir:
    """A directory laid out as the kubelet lays out a Secret volume: tls.crt -> ..data/tls.crt,
    ..data -> ..<version>, and a new version swapped in by renaming a fresh ..data symlink over it."""

    _versions = itertools.count()

    def __init__(self, path: Path, pair: Pair) -> None:
        self.path = path
        path.mkdir(exist_ok=True)
        self.write(pair.key, pair.cert)
        for name in ("tls.crt", "tls.key"):
            (path / name).symlink_to(Path("..data") / name)

    def write(self, key: bytes, cert: bytes) -> None:
        version = f"..v{next(self._versions)}"
        (self.path / version).mkdir()
        (self.path / version / "tls.key").write_bytes(key)
        (self.path / version / "tls.crt").write_bytes(cert)
        (self.path / "..data_tmp").symlink_to(version)
        os.replace(self.path / "..data_tmp", self.path / "..data")

    def rotate(self, pair: Pair) -> None:
        self.write(pair.key, pair.cert)


@asynccontextmanager
async def serving(**options: object) -> AsyncIterator[ExtProcServer]:
    director = Director(load_default_config(seed=1), Datastore().snapshot)
    server = ExtProcServer(director, ExtProcOptions(host="127.0.0.1", port=0, health_port=0, **options))  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def health(port: int, root: bytes, client: Pair | None = None) -> int:
    """The health status over a new TLS connection trusting `root` (presenting `client` if given);
    grpc.aio.AioRpcError when the handshake fails."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        return int(reply.status)


async def refused(port: int, root: bytes, client: Pair | None = None) -> bool:
    try:
        await health(port, root, client)
    except grpc.aio.AioRpcError as e:
        return bool(e.code() == grpc.StatusCode.UNAVAILABLE)
    return False


def ports(server: ExtProcServer) -> tuple[int, int]:
    return server.port, server.health_port


async def test_both_ports_serve_the_certificate_from_the_cert_dir(tmp_path: Path) -> None:
    ca = CA("ca-a")
    secret = SecretDir(tmp_path / "certs", ca.issue())
    async with serving(cert_path=str(secret.path)) as server:
        for port in ports(server):
            assert await health(port, ca.pem) == SERVING
            assert await refused(port, CA("someone-else").pem)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # no plaintext
                with pytest.raises(grpc.aio.AioRpcError):
                    await health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=5
                    )


async def test_self_signed_serves_tls_on_both_ports() -> None:
    async with serving() as server:
        assert server.certificates is not None
        _, material = server.certificates.current()
        for port in ports(server):
            assert await health(port, material.chain) == SERVING


async def test_a_rotated_certificate_reaches_new_connections_and_old_streams_go_on(tmp_path: Path) -> None:
    old, new = CA("ca-old"), CA("ca-new")
    secret = SecretDir(tmp_path / "certs", old.issue())
    async with serving(cert_path=str(secret.path)) as server:
        grpc_server = server._server
        credentials = grpc.ssl_channel_credentials(root_certificates=old.pem)
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "localhost")]
        async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", credentials, options=options) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert (await watch.read()).status == SERVING

            secret.rotate(new.issue())
            for port in ports(server):
                assert await health(port, new.pem) == SERVING
                assert await refused(port, old.pem)

            # The stream made over the old certificate's connection still carries updates.
            server.health.update(draining=True)
            assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
            watch.cancel()
        assert server._server is grpc_server


@pytest.mark.parametrize("damage", ["garbage certificate", "key of another certificate", "missing key"])
async def test_unusable_new_files_keep_the_old_pair_serving(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = CA("ca-old"), CA("ca-new")
    secret = SecretDir(tmp_path / "certs", old.issue())
    async with serving(cert_path=str(secret.path)) as server:
        good = new.issue()
        if damage == "garbage certificate":
            secret.write(good.key, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
            named = "tls.crt"
        elif damage == "key of another certificate":
            secret.write(new.issue().key, good.cert)
            named = "tls.key"
        else:
            secret.write(good.key, good.cert)
            (secret.path / "..data" / "tls.key").unlink()
            named = "tls.key"
        with caplog.at_level(logging.ERROR, logger="epick.extproc.tls"):
            for port in ports(server):
                for _ in range(2):
                    assert await health(port, old.pem) == SERVING
                    assert await refused(port, new.pem)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors  # once, not on every handshake
        assert str(secret.path / named) in errors[0]

        secret.rotate(good)  # fixed: the next connection gets it
        for port in ports(server):
            assert await health(port, new.pem) == SERVING
            assert await refused(port, old.pem)


async def test_client_certificates_are_required_with_a_client_ca(tmp_path: Path) -> None:
    server_ca, client_ca, other_ca = CA("server-ca"), CA("client-ca"), CA("other-ca")
    secret = SecretDir(tmp_path / "certs", server_ca.issue())
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(client_ca.pem)
    good, foreign = client_ca.issue("gateway", client=True), other_ca.issue("gateway", client=True)
    async with serving(cert_path=str(secret.path), client_ca_path=str(ca_file)) as server:
        for port in ports(server):
            assert await refused(port, server_ca.pem)
            assert await health(port, server_ca.pem, good) == SERVING
            assert await refused(port, server_ca.pem, foreign)

        ca_file.write_bytes(other_ca.pem)  # the client CA file is reloaded too
        for port in ports(server):
            assert await health(port, server_ca.pem, foreign) == SERVING
            assert await refused(port, server_ca.pem, good)


async def test_without_reload_the_first_certificate_stays(tmp_path: Path) -> None:
    old, new = CA("ca-old"), CA("ca-new")
    secret = SecretDir(tmp_path / "certs", old.issue())
    async with serving(cert_path=str(secret.path), cert_reload=False) as server:
        secret.rotate(new.issue())
        for port in ports(server):
            assert await health(port, old.pem) == SERVING
            assert await refused(port, new.pem)


def test_rotation_under_uvloop(tmp_path: Path) -> None:
    """`epick serve` runs on uvloop; gRPC calls the fetcher from its own thread there too."""
    old, new = CA("ca-old"), CA("ca-new")
    secret = SecretDir(tmp_path / "certs", old.issue())

    async def scenario() -> None:
        async with serving(cert_path=str(secret.path)) as server:
            assert await health(server.port, old.pem) == SERVING
            secret.rotate(new.issue())
            for port in ports(server):
                assert await health(port, new.pem) == SERVING
                assert await refused(port, old.pem)

    uvloop.run(scenario())


def test_same_content_is_not_a_new_certificate(tmp_path: Path) -> None:
    pair = CA("ca").issue()
    secret = SecretDir(tmp_path / "certs", pair)
    store = CertificateStore(secret.path)
    assert store.current()[0] == 0
    secret.rotate(pair)  # new files, same bytes (a Secret re-synced without a change)
    assert store.current()[0] == 0
    secret.rotate(CA("ca").issue())
    assert store.current()[0] == 1


async def test_start_fails_on_unusable_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TlsFileError, match=r"tls\.key: cannot read"):
        async with serving(cert_path=str(tmp_path / "empty")):
            pass
    with pytest.raises(ValueError, match="needs TLS"):
        ExtProcOptions(secure=False, client_ca_path=str(tmp_path / "ca.crt"))


@pytest.mark.parametrize("secure", [True, False])
async def test_a_second_server_cannot_take_the_same_ports(secure: bool) -> None:
    """gRPC would share a port between two processes (SO_REUSEPORT) and split Envoy's streams between
    two prefix indexes; epick binds its ports exclusively, and a second bind names the port."""
    ds = Datastore()
    director = Director(load_default_config(seed=1), ds.snapshot)
    first = ExtProcServer(director, ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=secure))
    await first.start()
    try:
        for port, health in ((first.port, 0), (0, first.health_port)):
            second = ExtProcServer(
                director, ExtProcOptions(host="127.0.0.1", port=port, health_port=health, secure=secure)
            )
            with pytest.raises(
                OSError, match=r"cannot listen on 127\.0\.0\.1:\d+ for gRPC: the port is in use"
            ):
                await second.start()
            await second.stop()
    finally:
        await first.stop()
