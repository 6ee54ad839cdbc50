"""Opening a file that may have been planted: a regular file only, never blocking, never past its size cap.

The one way the package opens a file someone else may have put in its way (a cache entry, a manifest, a
transcript, a map's run folder, a grant's target). A FIFO, a device, a socket or a folder where a file
should be is refused: the open uses ``O_NONBLOCK`` and checks ``fstat`` on the open descriptor, so a FIFO
never blocks and a swap after a check cannot slip past; a file that never ends (``/dev/zero``) is never
read; a regular file larger than its reader takes is refused before a byte is read (``read_regular``
never reads past the size it had when opened, if it grows meanwhile). ``follow_symlinks=False``
(``O_NOFOLLOW``) refuses a symbolic link as the last component where a file must be the folder's own.
Every descriptor is close-on-exec. ``flags`` opens it for writing too (``O_WRONLY``, ``O_RDWR``, with
``O_APPEND``, ``O_CREAT``, ``O_TRUNC``): a run folder's own files and a lock file take the same checks.

Standard library only, in the bottom layer of the package (pyproject.toml's layers contract, beside
``text`` and ``version``), so that every layer opens files the same way.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any

__all__ = ["NotARegularFile", "ACCESS_FLAGS", "open_fd", "open_regular", "read_regular", "kind_of"]


class NotARegularFile(OSError):
    """A path that is not a regular file its reader may take -- a FIFO, a device, a socket, a folder, a
    symbolic link where none is followed, or a file past its size cap -- refused unread. ``strerror`` says
    which, in words a person can act on; ``errno`` is ``ELOOP`` for a link, ``EISDIR`` for a folder,
    ``EFBIG`` for a file too large, ``EINVAL`` for the rest."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a regular file``, ``a FIFO (named pipe)``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


#: The flags ``open_fd`` takes besides how it opens (they are its own): the access mode and what writing does.
ACCESS_FLAGS = os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_EXCL


def open_fd(path: str | os.PathLike, max_bytes: int | None = None, *, follow_symlinks: bool = True,
            dir_fd: int | None = None, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A close-on-exec descriptor of ``path`` (relative to ``dir_fd`` if given), if it is a regular file of at
    most ``max_bytes``; ``NotARegularFile`` if not, ``FileNotFoundError`` and the other ``OSError`` as ``open``
    raises them. Read-only unless ``flags`` say otherwise (``ACCESS_FLAGS``; ``mode`` for a file created).
    Never blocks. The caller closes the descriptor."""
    if flags & ~ACCESS_FLAGS:
        raise ValueError(f"open_fd sets its own flags; it takes only access flags, not {flags & ~ACCESS_FLAGS:#o}")
    if flags & (os.O_CREAT | os.O_TRUNC) and follow_symlinks:
        raise ValueError("open_fd creates or truncates only with follow_symlinks=False: never through a link")
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks and _is_link(path, dir_fd):
            raise NotARegularFile(errno.ELOOP, "a symbolic link, which is not followed here", os.fspath(path)) \
                from None
        if e.errno == errno.ENXIO:  # a socket; or a FIFO opened to write with no reader
            raise NotARegularFile(errno.EINVAL, f"{_kind_at(path, dir_fd)}, not a regular file",
                                  os.fspath(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
            raise NotARegularFile(code, f"{kind_of(st.st_mode)}, not a regular file", os.fspath(path))
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotARegularFile(errno.EFBIG, f"{st.st_size} bytes, more than the {max_bytes} it may be",
                                  os.fspath(path))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _kind_at(path, dir_fd) -> str:
    try:
        return kind_of(os.stat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return "not a regular file"


def _is_link(path, dir_fd) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def open_regular(path: str | os.PathLike, max_bytes: int | None = None, *, follow_symlinks: bool = True,
                 dir_fd: int | None = None, flags: int = os.O_RDONLY, mode: str = "rb") -> IO[Any]:
    """``path`` open as a file object (``open_fd``'s checks; ``flags`` as there, ``mode`` the object's: ``rb``,
    ``ab``, ``a`` for text, ...). With ``max_bytes`` None the caller bounds what it reads itself (a transcript
    read a line at a time, each line capped)."""
    fd = open_fd(path, max_bytes, follow_symlinks=follow_symlinks, dir_fd=dir_fd, flags=flags)
    try:
        return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True,
                 dir_fd: int | None = None) -> bytes:
    """The bytes of ``path`` (``open_fd``'s checks, at most ``max_bytes``): as many as it held when opened, so a
    file that grows meanwhile is never read past that size (nor past the cap)."""
    with open_regular(path, max_bytes, follow_symlinks=follow_symlinks, dir_fd=dir_fd) as f:
        # read(n) sets n bytes aside: never more than the file held, nor than the cap if it grew since the open
        return f.read(min(os.fstat(f.fileno()).st_size, max_bytes))
