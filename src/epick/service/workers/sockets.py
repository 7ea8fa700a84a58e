"""The ports the supervisor holds for its workers: the proxy's listening sockets, the gRPC ports."""

from __future__ import annotations

import fcntl
import socket
import tempfile
from pathlib import Path
from typing import Any


def bind_proxy(host: str, port: int, count: int) -> tuple[list[socket.socket], Any]:
    """One listening socket per worker on the proxy's port (SO_REUSEPORT: the kernel spreads new
    connections over them evenly), and the lock that keeps another epick from joining them. A port
    another process holds fails here, naming it."""
    where = f"{host}:{port}"
    lock = open(Path(tempfile.gettempdir()) / f"epick-proxy-{host}-{port}.lock", "w")  # noqa: SIM115
    if port:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise OSError(f"cannot listen on {where} for the proxy: another epick serves it") from None
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.create_server((host, port), backlog=4096, reuse_port=True))
            port = sockets[0].getsockname()[1]
    except OSError as e:
        for sock in sockets:
            sock.close()
        lock.close()
        raise OSError(f"cannot listen on {where} for the proxy: {e.strerror or e}") from None
    return sockets, lock


def reserve_grpc(host: str, port: int) -> tuple[Any, socket.socket]:
    """Keep a gRPC port for the workers: a lock (against another epick) and a socket bound with
    SO_REUSEPORT but not listening (against anything binding it without; it takes no connections)."""
    lock = open(Path(tempfile.gettempdir()) / f"epick-grpc-{host}-{port}.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise OSError(f"cannot listen on {host}:{port} for gRPC: another epick serves it") from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        lock.close()
        raise OSError(f"cannot listen on {host}:{port} for gRPC: {e.strerror or e}") from None
    return lock, sock
