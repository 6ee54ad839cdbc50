"""The one safe open (``regular_file``): a regular file of at most its cap, or a refusal at once -- for every
kind of thing a path can name.

A Hypothesis property plants one of them -- a regular file (small, at the cap, past it, sparse and huge,
growing while read, truncated while read), a FIFO with no writer, a symbolic link (to a file, to a FIFO, to
``/dev/zero``, dangling, to itself), a folder, a character device, a Unix socket -- and opens it with and
without following links, under a cap: the answer is the file's bytes exactly when it is a regular file within
the cap (reached through a link only where links are followed), else ``NotARegularFile`` (or
``FileNotFoundError`` for what is not there), and never a block: each open runs on a thread that must end.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorjob_jupyter.regular_file import NotARegularFile, open_fd, open_regular, read_regular

KINDS = ("small", "at_cap", "past_cap", "huge_sparse", "growing", "truncated", "fifo", "link_file", "link_fifo",
         "link_zero", "link_dangling", "link_loop", "folder", "device", "socket", "missing")
CAP = 4096


def plant(where: Path, kind: str, data: bytes) -> Path:
    path = where / f"f-{kind}"
    if kind in ("small", "growing", "truncated"):
        path.write_bytes(data)
    elif kind == "at_cap":
        path.write_bytes(data[:1] * CAP)
    elif kind == "past_cap":
        path.write_bytes(data[:1] * (CAP + 1) or b"x" * (CAP + 1))
    elif kind == "huge_sparse":
        with open(path, "wb") as f:
            f.truncate(1 << 40)  # a terabyte of nothing: refused by its size, never read
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_file":
        (where / "target").write_bytes(data)
        path.symlink_to(where / "target")
    elif kind == "link_fifo":
        os.mkfifo(where / "pipe")
        path.symlink_to(where / "pipe")
    elif kind == "link_zero":
        path.symlink_to("/dev/zero")
    elif kind == "link_dangling":
        path.symlink_to(where / "nothing")
    elif kind == "link_loop":
        path.symlink_to(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/null")  # a device node cannot be made unprivileged; a link to one is what is met
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


def bounded(fn, seconds: float = 60.0):
    """``fn()``'s value or exception, from a thread that must end (a blocked open fails the test)."""
    box: list = []

    def call() -> None:
        try:
            box.append(("value", fn()))
        except BaseException as e:  # noqa: BLE001 - handed back
            box.append(("error", e))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "the open blocked"
    return box[0]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), data=st.binary(min_size=1, max_size=CAP), follow=st.booleans(),
       reader=st.sampled_from(("read", "open")))
def test_only_a_regular_file_within_its_cap_is_read(tmp_path_factory, kind, data, follow, reader):
    where = tmp_path_factory.mktemp("kinds")
    path = plant(where, kind, data)
    if kind == "growing":  # appended to all the while: a prefix within the cap, or refused by its size
        stop = threading.Event()

        def grow() -> None:
            with open(path, "ab") as w:
                while not stop.is_set():
                    w.write(b"g" * 512)
                    w.flush()

        grower = threading.Thread(target=grow)
        grower.start()
        try:
            outcome, value = bounded(lambda: read_regular(path, 4 * CAP, follow_symlinks=follow))
        finally:
            stop.set()
            grower.join()
        assert (outcome == "value" and value.startswith(data) and len(value) <= 4 * CAP) or (
            outcome == "error" and isinstance(value, NotARegularFile) and value.errno == errno.EFBIG)
        return
    if kind == "truncated":  # cut short after the open: what is there is read, no more, no error
        def read():
            with open_regular(path, CAP, follow_symlinks=follow) as f:
                os.truncate(path, len(data) // 2)
                return f.read()
        assert bounded(read) == ("value", data[:len(data) // 2])
        return
    if reader == "read":
        outcome, value = bounded(lambda: read_regular(path, CAP, follow_symlinks=follow))
    else:
        def opened():
            with open_regular(path, CAP, follow_symlinks=follow) as f:
                return f.read()
        outcome, value = bounded(opened)
    readable = {"small": data, "at_cap": data[:1] * CAP, "link_file": data}
    if kind in readable and (follow or not kind.startswith("link")):
        assert (outcome, value) == ("value", readable[kind])
    elif kind == "missing" or (kind == "link_dangling" and follow):
        assert outcome == "error" and isinstance(value, FileNotFoundError)
    elif kind == "link_loop" and follow:  # the link chain itself is refused by the system (ELOOP)
        assert outcome == "error" and isinstance(value, OSError) and value.errno == errno.ELOOP
    else:
        assert outcome == "error" and isinstance(value, NotARegularFile), (kind, follow, value)
        assert value.strerror and "\n" not in value.strerror


def test_every_refusal_says_what_the_path_is(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link").symlink_to(tmp_path / "pipe")
    (tmp_path / "big").write_bytes(b"x" * 10)
    cases = {"pipe": "a FIFO (named pipe), not a regular file", "big": "10 bytes, more than the 4 it may be"}
    for name, words in cases.items():
        with pytest.raises(NotARegularFile) as raised:
            read_regular(tmp_path / name, 4)
        assert raised.value.strerror == words
    with pytest.raises(NotARegularFile) as raised:
        read_regular(tmp_path / "link", 4, follow_symlinks=False)
    assert raised.value.errno == errno.ELOOP and "symbolic link" in raised.value.strerror
    with pytest.raises(NotARegularFile) as raised:
        open_fd(tmp_path)
    assert raised.value.errno == errno.EISDIR
    with pytest.raises(NotARegularFile, match="character device"):
        read_regular("/dev/zero", 1 << 30)


def test_its_descriptors_are_close_on_exec_and_blocking(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    fd = open_fd(tmp_path / "f")
    try:
        assert not os.get_inheritable(fd) and os.get_blocking(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_regular("f", 3, dir_fd=dir_fd) == b"abc"
    finally:
        os.close(dir_fd)


WRITES = {"write": os.O_WRONLY, "append": os.O_WRONLY | os.O_APPEND, "create": os.O_WRONLY | os.O_CREAT,
          "replace": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "update": os.O_RDWR}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from([k for k in KINDS if k not in ("growing", "truncated", "huge_sparse")]),
       data=st.binary(min_size=1, max_size=64), follow=st.booleans(), how=st.sampled_from(sorted(WRITES)))
def test_writing_goes_only_into_a_regular_file_and_never_through_a_link_it_refuses(tmp_path_factory, kind, data,
                                                                                   follow, how):
    """The run folder's own files, a lock, a staged transcript: opened to write with the same checks. The
    descriptor is a regular file's, close-on-exec and blocking -- or the open is refused at once, and whatever
    the path named (a FIFO with no reader, a link's target, ``/dev/null``) is left as it was."""
    where = tmp_path_factory.mktemp("writes")
    path = plant(where, kind, data)
    target = where / "target"
    before = target.read_bytes() if target.exists() else None
    outcome, value = bounded(lambda: open_fd(path, flags=WRITES[how], follow_symlinks=follow))
    if follow and WRITES[how] & (os.O_CREAT | os.O_TRUNC):  # never created or truncated through a link
        assert outcome == "error" and isinstance(value, ValueError), value
        assert (target.read_bytes() if target.exists() else None) == before
        return
    if outcome == "value":
        try:
            st_ = os.fstat(value)
            assert stat.S_ISREG(st_.st_mode) and not os.get_inheritable(value) and os.get_blocking(value)
            os.write(value, b"!")
        finally:
            os.close(value)
        assert kind in ("small", "at_cap", "past_cap", "link_file", "missing")
        assert follow or not kind.startswith("link")  # a link is written through only where links are followed
        assert kind != "missing" or WRITES[how] & os.O_CREAT  # made only by an open that creates
        return
    assert isinstance(value, OSError), value
    if kind.startswith("link") and not follow:
        assert isinstance(value, NotARegularFile) and value.errno == errno.ELOOP
    if kind in ("fifo", "link_fifo", "folder", "device", "socket", "link_zero") and (follow or not
                                                                                   kind.startswith("link")):
        assert isinstance(value, (NotARegularFile, IsADirectoryError)) or value.errno in (errno.EISDIR,
                                                                                         errno.ENXIO), value
    assert (target.read_bytes() if target.exists() else None) == before  # a refused open wrote nothing


def test_open_fd_sets_its_own_flags():
    with pytest.raises(ValueError, match="access flags"):
        open_fd("/dev/null", flags=os.O_RDONLY | os.O_NONBLOCK)
