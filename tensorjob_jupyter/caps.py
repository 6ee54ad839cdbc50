"""Read grants: which paths a job's guest may open, decided once, at ``open``.

A grant is a root -- a directory or a single file -- canonicalised when the
job is created. A requested path is allowed when its canonical form (``..``
resolved, symlinks followed) lies under a root *by path components*, so
``data-secret`` is never inside ``data`` and a symlink pointing out of a root
leads nowhere. A nonexistent root grants nothing.

The answer for a path that cannot be opened depends on where it would be: a
missing file inside a granted root is ``not_found`` (the guest could have
learnt that by listing the root itself), but outside every root the answer is
always ``capability_denied``, so a guest cannot probe for existence.

The check and the open are one operation (``open_checked``): the file is
opened without blocking, must be a regular file, and the path of the open
descriptor is checked against the roots again, so swapping a symlink in after
the check gains nothing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .abi import codes


class AccessError(Exception):
    """An ``open`` the job may not perform; ``code`` is the envelope code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _denied(path: str) -> AccessError:
    return AccessError(codes.CAPABILITY_DENIED, f"read not permitted: {path}")


@dataclass(frozen=True)
class Grants:
    """The canonical read roots of one job (empty grants nothing)."""

    roots: tuple[Path, ...]
    cwd: Path

    @classmethod
    def for_paths(cls, paths: Iterable[str | os.PathLike], cwd: str | os.PathLike | None = None) -> "Grants":
        base = Path(cwd) if cwd is not None else Path.cwd()
        roots = []
        for p in paths:
            p = os.fspath(p)
            if not p or "\0" in p:
                continue
            try:
                roots.append(Path(os.path.realpath(base / p, strict=True)))
            except OSError:
                continue  # a root that does not exist grants nothing
        return cls(tuple(dict.fromkeys(roots)), base)

    def _inside(self, canonical: Path) -> bool:
        return any(canonical == r or canonical.is_relative_to(r) for r in self.roots)

    def resolve(self, path: str) -> Path:
        """The canonical path of ``path`` if the job may read it, else ``AccessError``."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise _denied(repr(path) if isinstance(path, str) else str(path))
        target = self.cwd / path
        try:
            canonical = Path(os.path.realpath(target, strict=True))
        except OSError:
            raise self._missing_or_denied(path, target) from None
        if not self._inside(canonical):
            raise _denied(path)
        return canonical

    def _missing_or_denied(self, path: str, target: Path) -> AccessError:
        if os.path.lexists(target):
            # It exists but does not resolve (a dangling or looping symlink):
            # never an existence oracle, whatever it points at.
            return _denied(path)
        probe = target
        while True:
            parent = probe.parent
            if parent == probe:
                return _denied(path)
            probe = parent
            try:
                ancestor = Path(os.path.realpath(probe, strict=True))
            except OSError:
                continue
            if self._inside(ancestor):
                return AccessError(codes.NOT_FOUND,
                                   f"no such file: {path} -- it is inside a granted root, so the path "
                                   f"is wrong rather than the grant")
            return _denied(path)

    def open_checked(self, path: str) -> tuple[int, Path]:
        """Check ``path`` and open it read-only; returns (fd, canonical path)."""
        canonical = self.resolve(path)
        try:
            fd = os.open(canonical, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise AccessError(codes.NOT_FOUND, f"no such file: {path}") from None
        except OSError as e:
            raise AccessError(codes.CAPABILITY_DENIED, f"cannot open {path}: {e.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
                raise AccessError(codes.CAPABILITY_DENIED, f"cannot open {path}: it is {kind}")
            opened = _fd_path(fd)
            if opened is not None and not self._inside(opened):
                raise _denied(path)
        except BaseException:
            os.close(fd)
            raise
        return fd, canonical


def _fd_path(fd: int) -> Path | None:
    """Where an open descriptor really points (Linux); None where unknown."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None
