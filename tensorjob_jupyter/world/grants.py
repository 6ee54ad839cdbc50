"""Read grants: which paths a job's guest may open, decided at ``open``, beneath a root.

A grant is a root, canonicalised when the job is created (host input, trusted). A path from the
guest (hostile) is answered in three moves, none of which looks outside the roots: lexically (it
must lie under a root by path components, so the answer outside every root is always
``capability_denied``), then walked beneath the root from its descriptor (``O_NOFOLLOW``, symlinks
followed only while they stay under a root), then opened as a regular file. There is no
``realpath`` and no walk over ancestors, and a path's length is bounded before any work.

A folder can be *withheld* (``Withheld``): nothing beneath it opens, whatever grant covers it -- a map's own run
folder, which holds the expected answers and the results, under a grant of the folder around it. It is refused
lexically, then again on the walk, where every directory the walk enters is compared with it by identity (device
and inode), so no symlink, ``..`` or second spelling reaches it.

Design: docs/internals/world.md#grantspy
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.regular_file import NotARegularFile, open_fd

#: The longest path a guest may ask for, in UTF-8 bytes (Linux's PATH_MAX).
MAX_PATH_BYTES = 4096
#: Symlinks followed in one ``open`` before it is refused (Linux's limit).
MAX_SYMLINKS = 40
#: Characters of a guest's path repeated in an error message.
SHOWN_PATH_CHARS = 200

_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class AccessError(JobFailure):
    """An ``open`` the job may not perform; ``code`` is the envelope code."""


def shown(path: str) -> str:
    """A guest's path as an error message repeats it: bounded, and printable."""
    text = path if len(path) <= SHOWN_PATH_CHARS else path[:SHOWN_PATH_CHARS] + f"... ({len(path)} characters)"
    return text.replace("\0", "\\0")


def _denied(path: str, why: str = "") -> AccessError:
    return AccessError(codes.CAPABILITY_DENIED, f"read not permitted: {shown(path)}{why}")


#: What a person can do about a path outside the grants, in the front ends' words.
UNGRANTED = " (it is under no read grant: grant its folder with --read DIR, or read=[...] in Python)"
LEADS_OUT = " (it leads out of the granted roots: grant where it leads with --read DIR, or read=[...] in Python)"


def _withheld_error(path: str, hold: "Hold") -> AccessError:
    return _denied(path, f" (it is in {hold.what} {shown(str(hold.path))}, which no guest may read even where a "
                         f"read grant covers it)")


def _not_found(path: str) -> AccessError:
    return AccessError(codes.NOT_FOUND, f"no such file: {shown(path)} -- it is inside a granted root, so the "
                                        f"path is wrong rather than the grant")


def _lexical(path: str, base: str) -> str:
    """``path`` made absolute against ``base`` and normalised as text only."""
    joined = path if path.startswith("/") else base + "/" + path
    norm = posixpath.normpath(joined)
    return "/" + norm.lstrip("/")  # POSIX lets "//x" differ from "/x"; here it does not


def _under(path: str, root: str) -> str | None:
    """The part of ``path`` below ``root`` ("" for the root itself), or None."""
    if path == root:
        return ""
    prefix = root if root.endswith("/") else root + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


@dataclass(frozen=True)
class Root:
    """One granted root: its canonical path, the spellings that name it, file or directory."""

    path: Path
    names: tuple[str, ...]
    is_dir: bool


@dataclass(frozen=True)
class Withheld:
    """A folder to carve out of a job's read grants (``Grants.for_paths``): nothing beneath it opens, whatever
    grant covers it, and an open there is ``capability_denied`` naming it as ``what`` (a map's run folder:
    ``"the map's run folder"``). It may stand in a job's ``read`` beside the paths granted (a map's items' jobs
    carry theirs so); it is never a path itself, so nothing can mistake it for a grant."""

    path: str
    what: str = "a withheld folder"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path or "\0" in self.path:
            raise ValueError(f"a withheld folder is a path, not {self.path!r}")


@dataclass(frozen=True)
class Hold:
    """One withheld folder: its canonical path, the spellings that name it, and what it is (for messages)."""

    path: Path
    names: tuple[str, ...]
    what: str

    def holds(self, canonical: Path) -> bool:
        """Whether the canonical path ``canonical`` is this folder or lies beneath it."""
        return _under(str(canonical), str(self.path)) is not None

    def identity(self) -> tuple[int, int] | None:
        """The folder's (device, inode) now; None where it does not exist (nothing can be read there yet)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino


class _Escape(Exception):
    """The walk would leave every granted root."""


class _Held(Exception):
    """The walk entered a withheld folder."""

    def __init__(self, hold: Hold):
        super().__init__(str(hold.path))
        self.hold = hold


@dataclass(frozen=True)
class Grants:
    """The read roots of one job (empty grants nothing), less the folders withheld from it. Small and
    picklable."""

    grants: tuple[Root, ...]
    cwd: Path
    withheld: tuple[Hold, ...] = ()

    @classmethod
    def for_paths(cls, paths: Iterable[str | os.PathLike | Withheld], cwd: str | os.PathLike | None = None, *,
                  withheld: Iterable[Withheld] = ()) -> "Grants":
        """The grants of ``paths`` (relative ones against ``cwd``; one that does not exist grants nothing), less
        ``withheld`` and any ``Withheld`` among ``paths``."""
        base = os.path.abspath(cwd if cwd is not None else os.getcwd())
        roots: dict[Path, set[str]] = {}
        kinds: dict[Path, bool] = {}
        holds: dict[Path, tuple[set[str], str]] = {}
        paths = list(paths)
        for w in [*(p for p in paths if isinstance(p, Withheld)), *withheld]:  # the first names a folder held twice
            given = _lexical(w.path, base)
            canonical = Path(os.path.realpath(given))  # it may not exist yet; nothing is read there then
            holds.setdefault(canonical, (set(), w.what))[0].update({given, str(canonical)})
        for p in paths:
            if isinstance(p, Withheld):
                continue
            p = os.fspath(p)
            if not p or "\0" in p:
                continue
            given = _lexical(p, base)
            try:
                canonical = Path(os.path.realpath(given, strict=True))
                kinds[canonical] = stat.S_ISDIR(os.stat(canonical).st_mode)
            except OSError:
                continue  # a root that does not exist grants nothing
            roots.setdefault(canonical, set()).update({given, str(canonical)})
        return cls(tuple(Root(r, tuple(sorted(names)), kinds[r]) for r, names in roots.items()), Path(base),
                   tuple(Hold(h, tuple(sorted(names)), what) for h, (names, what) in holds.items()))

    @property
    def roots(self) -> tuple[Path, ...]:
        return tuple(r.path for r in self.grants)

    def _locate(self, absolute: str) -> tuple[Root, str] | None:
        """The root ``absolute`` lies under (the deepest), and the rest of the path."""
        best: tuple[Root, str] | None = None
        for root in self.grants:
            for name in root.names:
                rest = _under(absolute, name)
                if rest is not None and (best is None or len(rest) < len(best[1])):
                    best = (root, rest)
        return best

    def open_checked(self, path: str) -> tuple[int, Path]:
        """Check ``path`` and open it read-only; returns (fd, the path opened)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise _denied(path if isinstance(path, str) else repr(path))
        if len(path) > MAX_PATH_BYTES or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
            raise _denied(path, f" (a path may be at most {MAX_PATH_BYTES} bytes)")
        if not path.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in path):
            raise _denied(path.encode("utf-8", "backslashreplace").decode(), " (not valid Unicode)")
        absolute = _lexical(path, str(self.cwd))
        for hold in self.withheld:  # as spelled: the answer does not depend on what exists there
            if any(_under(absolute, name) is not None for name in hold.names):
                raise _withheld_error(path, hold)
        located = self._locate(absolute)
        if located is None:
            raise _denied(path, UNGRANTED)
        try:
            fd = self._walk(*located)
        except _Escape:
            raise _denied(path, LEADS_OUT) from None
        except _Held as e:
            raise _withheld_error(path, e.hold) from None
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                raise _not_found(path) from None
            if e.errno == errno.ELOOP:
                raise _denied(path, f" (more than {MAX_SYMLINKS} symbolic links)") from None
            if isinstance(e, NotARegularFile):  # a folder, a FIFO, a device, a socket: checked on the open file
                kind = "a directory" if e.errno == errno.EISDIR else e.strerror
                raise AccessError(codes.CAPABILITY_DENIED, f"cannot open {shown(path)}: it is {kind}") from None
            raise AccessError(codes.CAPABILITY_DENIED, f"cannot open {shown(path)}: {e.strerror}") from None
        return fd, _fd_path(fd) or Path(located[0].path, located[1])

    def _check_root(self, root: Root) -> None:
        """``_Held`` for a root that lies in a withheld folder (both canonical)."""
        for hold in self.withheld:
            if hold.holds(root.path):
                raise _Held(hold)

    def _entered(self, fd: int, held: dict[tuple[int, int], Hold]) -> int:
        """``fd``, a directory the walk entered, unless it is a withheld folder (closed then, and ``_Held``)."""
        if held:
            st = os.fstat(fd)
            hold = held.get((st.st_dev, st.st_ino))
            if hold is not None:
                os.close(fd)
                raise _Held(hold)
        return fd

    def _walk(self, root: Root, rest: str) -> int:
        """Open ``rest`` beneath ``root``, one component at a time, never following
        a link out of the granted roots nor into a withheld folder. Returns the open file's descriptor."""
        self._check_root(root)
        if not root.is_dir:
            if rest:
                raise OSError(errno.ENOTDIR, "not a directory")
            return open_fd(root.path, follow_symlinks=False)
        held = {ident: hold for hold in self.withheld if (ident := hold.identity()) is not None}
        stack = [self._entered(os.open(root.path, _DIR_FLAGS), held)]  # descriptors from the root down
        todo = [part for part in reversed(rest.split("/")) if part not in ("", ".")]
        links = 0
        try:
            if not todo:  # the root directory itself
                return open_fd(".", dir_fd=stack[-1])
            while todo:
                name = todo.pop()
                if name == "..":  # only from a symlink's target: the path itself is normalised
                    if len(stack) == 1:
                        raise _Escape()
                    os.close(stack.pop())
                    continue
                last = not todo
                try:
                    fd = (open_fd(name, follow_symlinks=False, dir_fd=stack[-1]) if last
                          else os.open(name, _DIR_FLAGS, dir_fd=stack[-1]))
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    try:
                        target = os.readlink(name, dir_fd=stack[-1])
                    except OSError:
                        raise e from None  # not a link: a file where a directory was needed
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, "too many symbolic links") from None
                    if target.startswith("/"):  # start again from the root the target names
                        located = self._locate(_lexical(target, "/"))
                        if located is None:
                            raise _Escape() from None
                        self._check_root(located[0])
                        for d in stack:
                            os.close(d)
                        stack = []
                        if located[0].is_dir:
                            stack.append(self._entered(os.open(located[0].path, _DIR_FLAGS), held))
                        if not located[0].is_dir:
                            if located[1] or todo:
                                raise OSError(errno.ENOTDIR, "not a directory") from None
                            return open_fd(located[0].path, follow_symlinks=False)
                        target = located[1]
                    todo.extend(part for part in reversed(target.split("/")) if part not in ("", "."))
                    if not todo:
                        todo.append(".")
                    continue
                if last:
                    return fd
                stack.append(self._entered(fd, held))
            # A link resolved to a directory as the last step.
            return open_fd(".", dir_fd=stack[-1])
        finally:
            for d in stack:
                os.close(d)

    def resolve(self, path: str) -> Path:
        """The file ``open_checked`` would open, or ``AccessError``."""
        fd, opened = self.open_checked(path)
        os.close(fd)
        return opened


def _fd_path(fd: int) -> Path | None:
    """Where an open descriptor really points (Linux); None where unknown."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


__all__ = [
    "MAX_PATH_BYTES", "MAX_SYMLINKS", "SHOWN_PATH_CHARS", "AccessError", "shown", "UNGRANTED", "LEADS_OUT", "Root",
    "Withheld", "Hold", "Grants"
]
