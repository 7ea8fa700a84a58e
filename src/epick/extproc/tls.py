"""TLS for the ext_proc and gRPC health ports: the serving certificate, optional client verification
(mTLS), and reloading both when their files change.

The certificate comes from a directory with `tls.crt` (the chain, leaf first) and `tls.key`, the layout
of a Kubernetes TLS secret, or is self-signed at start-up as the Go EPP does when no `--cert-path` is
given. A client CA bundle, when given, makes every client present a certificate it signed.

Reloading: at each new connection's handshake (its ClientHello, through the SNI callback, called with or
without a server name) `ServerContexts` asks the store whether the files changed (their inode, size,
mtime or ctime, then their content), and hands the handshake a context made from the new set. Established
connections, and the streams on them, keep the certificate they were made with. Files that cannot be
read, do not parse, or whose key does not match the certificate are logged (naming the file) and the last
good set keeps serving.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
# A file whose mtime is this recent may be written again within the same timestamp tick without its
# stat changing (git's "racily clean" case), so its content is re-read until it is older than this.
_RACY_NS = 2_000_000_000


def self_signed(common_name: str = "epick") -> tuple[bytes, bytes]:
    """(private key PEM, certificate PEM), valid for ten years for localhost and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName(common_name),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def load_pair(cert_dir: str | Path) -> tuple[bytes, bytes]:
    """(key, cert) from tls.key and tls.crt in `cert_dir` (the layout of a Kubernetes TLS secret)."""
    d = Path(cert_dir)
    return (d / KEY_FILE).read_bytes(), (d / CERT_FILE).read_bytes()


class TlsFileError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class Material:
    """What one TLS configuration is made of, checked: the key matches the chain's first certificate."""

    key: bytes
    chain: bytes
    client_ca: bytes | None = None

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for part in (self.key, self.chain, self.client_ca or b""):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()

    def describe(self) -> str:
        leaf = x509.load_pem_x509_certificates(self.chain)[0]
        return (
            f"subject {leaf.subject.rfc4514_string()}, issuer {leaf.issuer.rfc4514_string()}, "
            f"expires {leaf.not_valid_after_utc.isoformat()}"
        )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TlsFileError(f"{path}: cannot read ({e.strerror or e})") from e


def _certificates(data: bytes, path: Path | str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise TlsFileError(f"{path}: not a PEM certificate ({e})") from e
    return certs


def check_material(key: bytes, chain: bytes, client_ca: bytes | None, where: dict[str, str]) -> Material:
    """`Material` from PEM bytes, or TlsFileError naming the file (`where` maps key, chain, client_ca
    to the file each came from)."""
    leaf = _certificates(chain, where["chain"])[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise TlsFileError(f"{where['key']}: not an unencrypted PEM private key ({e})") from e
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise TlsFileError(f"{where['key']}: does not match the certificate in {where['chain']}")
    if client_ca is not None:
        _certificates(client_ca, where["client_ca"])
    if leaf.not_valid_after_utc < datetime.datetime.now(datetime.UTC):
        log.warning("%s: the certificate expired at %s", where["chain"], leaf.not_valid_after_utc)
    return Material(key, chain, client_ca)


def read_material(cert_dir: str | Path | None, client_ca_path: str | Path | None) -> Material:
    """The pair from `cert_dir` (self-signed when None) and the client CA bundle, checked."""
    where = {"client_ca": str(client_ca_path)}
    if cert_dir is None:
        key, chain = self_signed()
        where |= {"key": "self-signed key", "chain": "self-signed certificate"}
    else:
        d = Path(cert_dir)
        where |= {"key": str(d / KEY_FILE), "chain": str(d / CERT_FILE)}
        key, chain = _read(d / KEY_FILE), _read(d / CERT_FILE)
    client_ca = _read(Path(client_ca_path)) if client_ca_path is not None else None
    return check_material(key, chain, client_ca, where)


_Stamp = tuple[int, int, int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = path.stat()  # follows the ..data symlinks of a Kubernetes secret volume
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class CertificateStore:
    """The serving key pair and client CA of the ext_proc and health ports, re-read from their files
    when these change (`reload`), keeping the last good set when the new files are unusable.

    With `cert_dir` None the pair is self-signed once and only the client CA file (if any) is watched.
    `current()` numbers the sets it has loaded (its generation); each port's fetcher hands gRPC the set
    when the generation moved past the one that port serves.
    """

    def __init__(
        self, cert_dir: str | Path | None, client_ca_path: str | Path | None = None, reload: bool = True
    ) -> None:
        self.cert_dir = Path(cert_dir) if cert_dir is not None else None
        self.client_ca_path = Path(client_ca_path) if client_ca_path is not None else None
        self.reload = reload
        self._self_signed = read_material(None, None) if self.cert_dir is None else None
        self._paths: Sequence[Path] = [
            *([self.cert_dir / CERT_FILE, self.cert_dir / KEY_FILE] if self.cert_dir is not None else []),
            *([self.client_ca_path] if self.client_ca_path is not None else []),
        ]
        self._lock = threading.Lock()
        self._stamps, self._racy = self._look()
        self._material = self._load()  # unusable files at start-up raise TlsFileError
        self._generation = 0
        self._last_error: str | None = None
        log.info("ext_proc TLS certificate: %s", self._material.describe())

    @property
    def require_client_auth(self) -> bool:
        return self.client_ca_path is not None

    def _look(self) -> tuple[tuple[_Stamp, ...], bool]:
        stamps = tuple(_stamp(p) for p in self._paths)
        now = time.time_ns()
        racy = any(s is not None and now - max(s[3], s[4]) < _RACY_NS for s in stamps)
        return stamps, racy

    def _load(self) -> Material:
        if self._self_signed is None:
            return read_material(self.cert_dir, self.client_ca_path)
        client_ca = _read(self.client_ca_path) if self.client_ca_path is not None else None
        where = {
            "key": "self-signed key",
            "chain": "self-signed certificate",
            "client_ca": str(self.client_ca_path),
        }
        return check_material(self._self_signed.key, self._self_signed.chain, client_ca, where)

    def current(self) -> tuple[int, Material]:
        """(generation, material), after re-reading the files if they changed since the last look."""
        with self._lock:
            if self.reload and self._paths:
                self._refresh()
            return self._generation, self._material

    def _refresh(self) -> None:
        stamps, racy = self._look()  # stat before reading: a change after this shows next time
        if stamps == self._stamps and not self._racy:
            return
        self._stamps, self._racy = stamps, racy
        try:
            material = self._load()
        except TlsFileError as e:
            if str(e) != self._last_error:
                log.error("ext_proc TLS files not reloaded, the previous certificate keeps serving: %s", e)
                self._last_error = str(e)
            return
        self._last_error = None
        if material.digest == self._material.digest:
            return
        self._material = material
        self._generation += 1
        log.info("ext_proc TLS certificate reloaded: %s", material.describe())


DEFAULT_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# `--tls-min-version` and `--tls-cipher-suites` take Go's crypto/tls names.
GO_TLS_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
GO_CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}


def tls_version(go_name: str) -> ssl.TLSVersion:
    """A Go TLS version name (`VersionTLS12`) as Python's; `ValueError` naming the ones known."""
    try:
        return GO_TLS_VERSIONS[go_name]
    except KeyError:
        raise ValueError(f"unknown TLS version {go_name!r} (one of {', '.join(GO_TLS_VERSIONS)})") from None


def cipher_string(go_names: Sequence[str]) -> str:
    """Go cipher suite names as an OpenSSL cipher string; `ValueError` for one it does not know."""
    unknown = [name for name in go_names if name not in GO_CIPHER_SUITES]
    if unknown:
        raise ValueError(
            f"unknown TLS cipher suite {unknown[0]!r} "
            "(Go crypto/tls names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)"
        )
    return ":".join(GO_CIPHER_SUITES[name] for name in go_names)


class ServerContexts:
    """asyncio's TLS for a `CertificateStore`: an `ssl.SSLContext` per loaded set (HTTP/2's ALPN `h2`,
    TLS 1.2 or later with the ciphers RFC 9113 allows; client certificates required with a client CA),
    each new handshake switched to the newest set when the store reloads."""

    def __init__(
        self,
        store: CertificateStore,
        alpn: Sequence[str] = ("h2",),
        *,
        minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
        ciphers: str = DEFAULT_CIPHERS,
    ) -> None:
        self.store = store
        self.alpn = list(alpn)  # HTTP/2 for gRPC; /metrics speaks HTTP/1.1
        self.minimum = minimum
        self.ciphers = ciphers
        self._generation, material = store.current()
        self._context = self._build(material)

    def context(self) -> ssl.SSLContext:
        return self._context

    def _build(self, material: Material) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.minimum
        context.set_ciphers(self.ciphers)  # TLS 1.2's and older; TLS 1.3's are all allowed
        context.set_alpn_protocols(self.alpn)
        with tempfile.TemporaryDirectory(prefix="epick-tls-") as d:  # load_cert_chain reads only files
            chain, key = Path(d) / CERT_FILE, Path(d) / KEY_FILE
            chain.write_bytes(material.chain)
            key.touch(mode=0o600)
            os.chmod(key, 0o600)
            key.write_bytes(material.key)
            context.load_cert_chain(chain, key)
        if material.client_ca is not None:
            context.load_verify_locations(cadata=material.client_ca.decode("ascii", "replace"))
            context.verify_mode = ssl.CERT_REQUIRED
        if self.store.reload:
            context.sni_callback = self._handshake
        return context

    def _handshake(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        try:
            generation, material = self.store.current()
            if generation != self._generation:
                self._context = self._build(material)
                self._generation = generation
            if context is not self._context:
                connection.context = self._context
        except Exception:  # never into the handshake: the previous certificate serves this connection
            log.exception("ext_proc TLS reload failed; the previous certificate keeps serving")
