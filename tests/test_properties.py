"""Properties of the guest boundary, searched by Hypothesis rather than listed.

Whatever bytes a guest returns, whatever path it asks for, whatever text it
sends to be shown, the host keeps its promises:

* every job ends within its time limit, with a documented error code, and
  leaves a whole transcript (parsing lines, gapless numbers, the terminal
  event last, ``envelope.json`` equal to it) and a small footprint;
* the next job on the same process is healthy;
* the answer to ``open`` for a path outside the grants never depends on what
  exists there, and no path opens a file outside them;
* what the boundary accepts can be encoded anywhere; text made inert stays
  inert.

The default profile keeps CI short; ``pytest --hypothesis-profile=deep
tests/test_properties.py`` searches much longer.
"""

from __future__ import annotations

import json
import os
import re
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.grants import AccessError, Grants
from tensorjob_jupyter.record.events import EventStream, TranscriptWriteError
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.host.reactor import GuestFailed
from tensorjob_jupyter.text import for_html, for_terminal, json_text

import wat
from conftest import assert_host_healthy

# --- generating what a guest can send ---------------------------------------------------------

# Text with everything in it: lone surrogates, controls, bidi marks, line separators.
any_text = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x1b[2J", "\u202e", "\u2028", "\x00", "é🎉", "../" * 5])
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | any_text)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(any_text, inner, max_size=5), max_leaves=30)


# What a careful guest sends: Unicode text, 64-bit integers, finite numbers.
valid_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
valid_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | valid_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(valid_text, inner, max_size=5), max_leaves=30)


def encode_like_a_guest(value, ascii_only: bool) -> bytes:
    """JSON bytes as a sloppy guest writes them: lone surrogates become \\u escapes or raw
    (invalid UTF-8) bytes, non-finite floats become NaN/Infinity, which JSON forbids."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


commands = st.one_of(
    st.builds(lambda v: {"cmd": "emit", "progress": v}, json_values),
    st.builds(lambda v: {"cmd": "done", "result": v}, json_values),
    st.builds(lambda c, m: {"cmd": "fail", "code": c, "message": m}, any_text, any_text),
    st.builds(lambda p: {"cmd": "open", "path": p}, any_text),
    st.builds(lambda h, o, n: {"cmd": "slice", "handle": h, "offset": o, "len": n},
              st.integers(-2, 2**65), st.integers(-2, 2**65), st.integers(-2, 2**65)),
    st.builds(lambda h, o, n: {"cmd": "slice_bytes", "handle": h, "offset": o, "len": n},
              st.integers(-1, 3), st.integers(-1, 50), st.integers(0, 50)),
    st.builds(lambda p, n: {"cmd": "infer", "prompt": p, "max_tokens": n}, any_text, st.integers(-1, 8)),
    st.builds(lambda t: {"cmd": "embed", "texts": t}, st.lists(any_text, max_size=3)),
    st.builds(lambda c, h, p: {"cmd": c, "handle": h, "page": p},
              st.sampled_from(["page_text", "page_text_opt", "page_image"]), st.integers(-1, 3), st.integers(-1, 2**33)),
    st.builds(lambda h: {"cmd": "document_text", "handle": h}, st.integers(-1, 3)),
    st.builds(lambda h, op: {"cmd": "image_op", "handle": h, "op": op}, st.integers(-1, 3), json_values),
    st.builds(lambda u: {"cmd": "fetch", "url": u}, any_text | st.sampled_from(
        ["http://127.0.0.1:9/x", "file:///etc/passwd", "https://example.org.evil/", "http://[::1]:0/"])),
    st.builds(lambda v: {"cmd": v}, any_text),
    json_values,
)
raw_commands = st.one_of(
    st.tuples(commands, st.booleans()).map(lambda c: encode_like_a_guest(*c)),
    st.binary(max_size=64),
    st.integers(100, 300).map(lambda d: b'{"cmd":"done","result":' + deep(d) + b"}"),
    st.just(b'{"cmd":"open","path":"data/a.txt"}'),
    st.just(b'{"cmd":"slice","handle":0,"offset":0,"len":4}'),
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("inside the grant")
    (root / "outside.txt").write_text("outside")
    return root


@pytest.fixture(scope="module")
def guest():
    return wat.input_script_guest()


def guest_fail_codes(script: list[bytes]) -> set[str]:
    found = set()
    for raw in script:
        try:
            command = abi.parse_command(raw)
        except abi.AbiError:
            continue
        if isinstance(command, abi.Fail):
            found.add(GuestFailed(command.code, command.message).code)
    return found


JOB_LIMITS = tj.Limits(job_timeout_s=5, call_timeout_s=2, max_event_bytes=1 << 20, max_steps=50)
GRACE_S = 5


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(script=st.lists(raw_commands, min_size=1, max_size=4))
def test_whatever_a_guest_returns_the_job_ends_whole(script, world, guest):
    started = time.monotonic()
    job = tj.Job(guest, input_bytes=wat.pack_commands(script), read=[world / "data"], cwd=world,
                 backend=ScriptedBackend("a b c"), limits=JOB_LIMITS).start()
    envelope = job.wait(JOB_LIMITS.job_timeout_s + GRACE_S)
    assert time.monotonic() - started < JOB_LIMITS.job_timeout_s + GRACE_S
    assert envelope.status.is_terminal
    if envelope.error is not None:
        # One of the documented codes, or the code of a `fail` the guest returned.
        assert envelope.error.code in abi.ERROR_CODES | guest_fail_codes(script)
        assert envelope.error.code != codes.INTERNAL_ERROR, envelope.error.message  # never a host bug
    lines = job.transcript_path.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == f"job.{envelope.status.value}"
    assert orjson.loads(job.envelope_path.read_bytes()) == envelope.to_json() == events[-1]["envelope"]
    assert job.retained_bytes <= JOB_LIMITS.max_result_bytes + 64 * 1024


def test_after_the_search_the_host_is_healthy():
    assert_host_healthy()


# --- the boundary itself --------------------------------------------------------------------


@given(value=json_values, ascii_only=st.booleans())
def test_what_the_boundary_accepts_can_be_encoded_anywhere(value, ascii_only):
    raw = encode_like_a_guest(value, ascii_only)
    try:
        parsed = abi.loads_strict(raw)
    except abi.AbiError:
        return
    # Encodable by every encoder the host uses, and unchanged by a round trip.
    assert orjson.loads(orjson.dumps(parsed)) == parsed
    json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    assert json.loads(json_text(parsed)) == parsed


@given(value=valid_values)
def test_valid_json_within_the_limits_always_passes_unchanged(value):
    assert abi.loads_strict(json.dumps(value, ensure_ascii=False).encode("utf-8")) == value
    assert abi.loads_strict(json.dumps(value, ensure_ascii=True).encode("utf-8")) == value


@given(depth=st.integers(1, 400), width=st.integers(0, 3))
def test_depth_is_refused_exactly_past_serde_jsons_limit(depth, width):
    inner = b"[" + b",".join([b'"[{"'] * width) + b"]"
    raw = b"[" * (depth - 1) + inner + b"]" * (depth - 1)
    if depth <= abi.MAX_DEPTH:
        assert isinstance(abi.loads_strict(raw), list)
    else:
        with pytest.raises(abi.AbiError, match="nested too deeply"):
            abi.loads_strict(raw)


# --- paths ------------------------------------------------------------------------------------

components = st.sampled_from(["a.txt", "..", ".", "", "data", "sub", "in", "out", "abs", "loop", "X", "deep",
                              "outside.txt", "f.txt"])
paths = st.lists(components, min_size=1, max_size=8).map("/".join) | any_text


def build_world(root, with_x: bool):
    """A grant ``data`` with inner links, and outside it a file, maybe an ``X``."""
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("inside a")
    (data / "sub" / "f.txt").write_text("inside f")
    (root / "outside.txt").write_text("OUTSIDE")
    os.symlink("sub", data / "in")
    os.symlink("../outside.txt", data / "out")
    os.symlink(str(root / "outside.txt"), data / "abs")
    os.symlink("loop", data / "loop")
    os.symlink("sub/../..", data / "deep")
    if with_x:
        (root / "X").mkdir()
        (root / "X" / "a.txt").write_text("OUTSIDE X")


def answer(grants: Grants, path: str):
    try:
        fd, _ = grants.open_checked(path)
    except AccessError as e:
        return e.code
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def two_worlds(tmp_path_factory):
    a, b = tmp_path_factory.mktemp("with_x"), tmp_path_factory.mktemp("without_x")
    build_world(a, True)
    build_world(b, False)
    return a, b


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths, absolute=st.booleans())
def test_open_never_leaves_the_grant_and_never_reveals_what_exists_outside(path, absolute, two_worlds):
    answers = []
    for root in two_worlds:
        grants = Grants.for_paths(["data"], cwd=root)
        answers.append(answer(grants, str(root / path) if absolute and path and "\0" not in path else path))
    assert answers[0] == answers[1]  # the worlds differ only outside the grant
    assert "OUTSIDE" not in answers[0]
    assert answers[0] in (codes.CAPABILITY_DENIED, codes.NOT_FOUND) or answers[0].startswith("inside")


@given(path=st.text(min_size=1, max_size=20_000))
def test_open_costs_little_whatever_the_path(path):
    grants = Grants.for_paths([])
    started = time.perf_counter()
    with pytest.raises(AccessError):
        grants.open_checked(path)
    assert time.perf_counter() - started < 0.1


# --- events -------------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.lists(st.one_of(json_values, st.just({1, 2}), st.just(object())), max_size=12))
def test_the_transcript_is_gapless_whatever_is_published(fields, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stream")
    stream = EventStream("j", run_dir)
    published = 0
    for value in fields:
        try:
            stream.publish("x", value=value)
            published += 1
        except TranscriptWriteError:
            pass
    stream.close(b"{}")
    events = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    assert [e["sequence_number"] for e in events] == list(range(published))


# --- inert text -----------------------------------------------------------------------------------

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@given(text=any_text | st.text(st.sampled_from("\x1b[]0;\x07\x9b\x9d\x9cm\\Pa\n\r\u202e"), max_size=30))
def test_text_made_inert_stays_inert(text):
    terminal = for_terminal(text)
    assert not UNSAFE.search(terminal.replace("\t", "").replace("\n", ""))
    one_line = for_terminal(text, one_line=True)
    assert "\n" not in one_line and "\r" not in one_line and not UNSAFE.search(one_line.replace("\t", ""))
    html = for_html(text)
    assert "<" not in html and ">" not in html and not UNSAFE.search(html.replace("\t", "").replace("\n", ""))


@given(value=valid_values | st.builds(lambda t: {"t": t}, st.text(st.sampled_from("\x1b\x7f\x9b\u202e\u2028a"))))
def test_printed_json_has_no_raw_controls_and_means_the_same(value):
    text = json_text(value)
    assert not UNSAFE.search(text.replace("\n", ""))
    assert json.loads(text) == value
