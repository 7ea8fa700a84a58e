"""A pod's service-account volume, as the kubelet writes it."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

_serial = itertools.count()


class ServiceAccountVolume:
    """The directory the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount, written as its
    AtomicWriter does: the files live in a timestamped directory, `..data` links to it, and each file
    name links through `..data`; an update writes a new directory and swaps `..data` in one rename."""

    def __init__(self, path: Path, ca: Path, namespace: str = "default") -> None:
        self.path = path
        self.ca = ca.read_bytes()
        self.namespace = namespace
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)  # readable by a container's non-root user, as the kubelet's defaultMode 0644

    def write(self, token: str) -> None:
        stamp = f"..2026_12_06_00_00_{next(_serial):02d}.000000001"
        target = self.path / stamp
        target.mkdir(mode=0o755)
        (target / "token").write_text(token)
        (target / "ca.crt").write_bytes(self.ca)
        (target / "namespace").write_text(self.namespace)
        for f in target.iterdir():
            f.chmod(0o644)
        old = os.readlink(self.path / "..data") if (self.path / "..data").is_symlink() else None
        os.symlink(stamp, self.path / "..data_tmp")
        os.rename(self.path / "..data_tmp", self.path / "..data")
        for name in ("token", "ca.crt", "namespace"):
            if not (self.path / name).is_symlink():
                os.symlink(f"..data/{name}", self.path / name)
        if old is not None:
            for f in (self.path / old).iterdir():
                f.unlink()
            (self.path / old).rmdir()
