"""The wire format, pinned byte for byte, and strict parsing of guest output."""

import json

import pytest

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import AbiError, Envelope, JobError, JobStatus, TokenAction, Usage, codes


def enc(value) -> str:
    return abi.dumps(value.to_json())


# --- cuttlefish's own examples ----------------------------------------------------


def test_infer_command_serializes_to_the_expected_json():
    assert enc(abi.Infer("hi", 32)) == '{"cmd":"infer","prompt":"hi","max_tokens":32,"images":[]}'


def test_every_command_serializes_tag_first_in_declaration_order():
    assert enc(abi.Open("a.txt")) == '{"cmd":"open","path":"a.txt"}'
    assert enc(abi.Slice(0, 0, 137)) == '{"cmd":"slice","handle":0,"offset":0,"len":137}'
    assert enc(abi.SliceBytes(1, 5, 6)) == '{"cmd":"slice_bytes","handle":1,"offset":5,"len":6}'
    assert enc(abi.Embed(("a", "b"))) == '{"cmd":"embed","texts":["a","b"]}'
    assert enc(abi.Emit({"done": 1})) == '{"cmd":"emit","progress":{"done":1}}'
    assert enc(abi.Done({"x": [1]})) == '{"cmd":"done","result":{"x":[1]}}'
    assert enc(abi.Fail("capability_denied", "no")) == '{"cmd":"fail","code":"capability_denied","message":"no"}'


def test_every_event_serializes_tag_first_in_declaration_order():
    assert enc(abi.Opened(0, 137)) == '{"event":"opened","handle":0,"len":137,"kind":{"kind":"text"}}'
    assert enc(abi.Opened(2, 9, abi.MediaKind("image", format="png"))) == (
        '{"event":"opened","handle":2,"len":9,"kind":{"kind":"image","format":"png"}}')
    assert enc(abi.Sliced("é", 2)) == '{"event":"sliced","text":"é","next_offset":2}'
    assert enc(abi.SlicedBytes("AAE=", 2)) == '{"event":"sliced_bytes","bytes_base64":"AAE=","next_offset":2}'
    assert enc(abi.InferDone("t", 44)) == '{"event":"infer_done","text":"t","tokens_out":44}'
    assert enc(abi.Embedded([[0.5, -0.5]])) == '{"event":"embedded","vectors":[[0.5,-0.5]]}'
    assert enc(abi.Emitted()) == '{"event":"emitted"}'


def test_every_command_round_trips():
    cmds = [abi.Infer("hi", 32), abi.Infer("see", 4, (0, 3)), abi.Open("a"), abi.Slice(0, 1, 2),
            abi.SliceBytes(0, 2**32 + 1, 3), abi.Embed(("x",)), abi.Emit([1, "two"]), abi.Done(None),
            abi.Fail("c", "m")]
    for cmd in cmds:
        assert abi.parse_command(abi.dumps(cmd.to_json()).encode()) == cmd


def test_every_event_round_trips():
    events = [abi.InferDone("a", 1), abi.Opened(0, 10, abi.MediaKind("document", pages=3, has_text_layer=False)),
              abi.Sliced("x", 1), abi.SlicedBytes("AA==", 1), abi.Embedded([[1.0]]), abi.Emitted()]
    for ev in events:
        assert abi.event_from_json(json.loads(abi.encode_event(ev))) == ev


def test_slice_offsets_survive_beyond_u32():
    cmd = abi.parse_command(b'{"cmd":"slice","handle":0,"offset":4294967296,"len":1}')
    assert cmd.offset == 2**32


def test_an_older_block_still_deserializes_the_new_fields():
    assert abi.parse_command(b'{"cmd":"infer","prompt":"hi","max_tokens":4}').images == ()
    assert abi.event_from_json({"event": "opened", "handle": 1, "len": 10}).kind == abi.TEXT


def test_unknown_extra_keys_are_ignored():
    assert abi.parse_command(b'{"cmd":"open","path":"a","future":true}') == abi.Open("a")


# --- strict parsing -------------------------------------------------------------------


@pytest.mark.parametrize("raw, fragment", [
    (b"{not json", "not valid JSON"),
    (b'\xff\xfe{"cmd":"done"}', "not valid UTF-8"),
    (b"[1,2]", "must be a JSON object"),
    (b'{"path":"a"}', "no `cmd` tag"),
    (b'{"cmd":"explode"}', "unknown command `explode`"),
    (b'{"cmd":7}', "`cmd` must be a string"),
    (b'{"cmd":"open"}', "missing field `path`"),
    (b'{"cmd":"open","path":3}', "`open.path` must be a string"),
    (b'{"cmd":"slice","handle":0,"offset":-1,"len":1}', "must not be negative"),
    (b'{"cmd":"slice","handle":4294967296,"offset":0,"len":1}', "out of range"),
    (b'{"cmd":"slice","handle":0,"offset":18446744073709551616,"len":1}', "out of range"),
    (b'{"cmd":"slice","handle":0,"offset":1.5,"len":1}', "unsigned integer"),
    (b'{"cmd":"slice","handle":true,"offset":0,"len":1}', "unsigned integer"),
    (b'{"cmd":"infer","prompt":"p","max_tokens":"8"}', "unsigned integer"),
    (b'{"cmd":"infer","prompt":"p","max_tokens":8,"images":"no"}', "must be an array"),
    (b'{"cmd":"embed","texts":["a",1]}', "array of strings"),
    (b'{"cmd":"done"}', "missing field `result`"),
    (b'{"cmd":"fail","code":"x"}', "missing field `message`"),
    (b'{"cmd":"open","path":"a","path":"b"}', "duplicate field `path`"),
    (b'{"cmd":"emit","progress":NaN}', "NaN is not valid JSON"),
])
def test_malformed_guest_output_names_the_problem(raw, fragment):
    with pytest.raises(AbiError) as info:
        abi.parse_command(raw)
    assert fragment in str(info.value)


def test_every_cuttlefish_command_is_implemented():
    assert abi.UNSUPPORTED_COMMANDS == frozenset()
    assert abi.parse_command(b'{"cmd":"page_text","handle":0,"page":0}') == abi.PageText(0, 0)


def test_deeply_nested_json_is_an_abi_error_not_a_crash():
    raw = b'{"cmd":"done","result":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(AbiError, match="nested too deeply"):
        abi.parse_command(raw)


# --- statuses, token actions, envelopes -------------------------------------------------


def test_token_action_maps_to_the_abi_integers():
    assert TokenAction.CONTINUE == 0 and TokenAction.STOP == 1
    assert TokenAction.from_i32(0) is TokenAction.CONTINUE
    assert TokenAction.from_i32(1) is TokenAction.STOP


def test_unknown_token_action_values_stop_rather_than_continue():
    assert TokenAction.from_i32(42) is TokenAction.STOP
    assert TokenAction.from_i32(-1) is TokenAction.STOP


def test_terminal_statuses_are_exactly_the_finished_ones():
    assert {s for s in JobStatus if s.is_terminal} == {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
    assert not JobStatus.INTERRUPTED.is_terminal
    assert JobStatus("cancelled") is JobStatus.CANCELLED


def test_completed_envelope_json():
    env = Envelope(JobStatus.COMPLETED, Usage(46, 44, 1628, "llama3.2:1b"), result={"summary": "s"})
    assert abi.dumps(env.to_json()) == (
        '{"status":"completed","result":{"summary":"s"},'
        '"usage":{"tokens_in":46,"tokens_out":44,"duration_ms":1628,"model":"llama3.2:1b"}}')


def test_a_completed_null_result_is_still_present():
    assert Envelope(JobStatus.COMPLETED, result=None).to_json()["result"] is None


def test_failed_envelope_carries_a_code_and_no_result():
    env = Envelope(JobStatus.FAILED, error=JobError(codes.CAPABILITY_DENIED, "read not permitted: x"))
    text = abi.dumps(env.to_json())
    assert '"status":"failed"' in text and '"code":"capability_denied"' in text and '"result"' not in text
    with pytest.raises(ValueError):
        Envelope(JobStatus.FAILED, result={"partial": True})


def test_envelope_round_trips():
    env = Envelope(JobStatus.CANCELLED, Usage(1, 2, 3, "m"), error=JobError("cancelled", "job cancelled"))
    assert Envelope.from_json(json.loads(abi.dumps(env.to_json()))) == env


def test_error_codes_are_the_cuttlefish_strings_plus_ours():
    assert {"model_load_failed", "capability_denied", "schema_validation_failed", "script_error", "wasm_trap",
            "timeout", "cancelled", "unsupported", "not_found"} <= abi.ERROR_CODES
    assert codes.LIMIT_EXCEEDED == "limit_exceeded"


def test_fast_encoded_events_are_byte_identical_to_the_reference_encoder():
    tricky = 'quote " backslash \\ nl \n tab \t nul \x00 del \x7f ctl \x1b u2028 \u2028 é 🎉 </script>'
    for event in (abi.Sliced(tricky, 2**40), abi.SlicedBytes("AAE=", 3), abi.InferDone(tricky, 7)):
        assert abi.encode_event(event) == abi.dumps(event.to_json()).encode("utf-8")
