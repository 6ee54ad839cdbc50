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
