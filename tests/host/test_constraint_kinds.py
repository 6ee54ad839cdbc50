"""A regex, choices and a Lark grammar, as a guest's author reaches them: Python, C and Zig guests and the CLI.

An ``infer`` may hold its whole answer to a regex, to one of a list of choices, or to a Lark grammar. These
tests reach each kind the way a user does -- ``tj.infer(prompt, regex=...)`` in a Python guest,
``tj_infer_regex``/``tj_infer_choices``/``tj_infer_grammar`` in C, ``tj.inferWith(.., .{ .regex = .. })`` in Zig,
and ``tensorjob run guests/examples/classify.c`` in a subprocess -- through the real host.

The fast tests decode with the tiny random-weight GGUF (tests/llama_support.py): llguidance masks every token, so
even a model of random weights answers only what the constraint allows, exactly and in milliseconds. The SDKs'
builders are checked byte for byte (``test_sdk_c.RawGuest``). A refusal -- a regex that does not parse, a rule
the grammar never defines, two kinds at once -- ends the job ``schema_validation_failed`` in one line saying why,
before any token; empty choices are a malformed command. The slow tests hold the embedded SmolLM2 to each kind.
Every test asserts that the answer satisfies its constraint, never which words the model chose.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama_support import smollm, tiny_files  # noqa: F401  (fixtures)
from python_guest_support import drive, ensure_interpreter, src
from test_sdk_c import RawGuest

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.sandbox import compile as tjc
from tensorjob_jupyter.sandbox.compile import GuestSource

ROOT = Path(__file__).resolve().parents[2]
CLASSIFY = ROOT / "guests" / "examples" / "classify.c"

#: Each kind: the value an infer carries, and a Python regex its answers must fully match. Each allows finitely
#: many answers, so even the random tiny model ends (the grammar allows only the end token once it is complete).
KINDS = {
    "regex": (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "choices": (["positive", "negative", "neutral"], r"positive|negative|neutral"),
    "grammar": ('start: answer "," level\nanswer: "yes" | "no"\nlevel: /[1-5]/', r"(yes|no),[1-5]"),
}

#: What the host cannot enforce, and what the one-line refusal must say.
REFUSED = [
    ({"regex": "[a-"}, "regex"),
    ({"grammar": "start: answer\n"}, "answer"),  # a rule the grammar never defines
    ({"regex": "[0-9]", "choices": ["a"]}, "takes one of format, regex, choices, grammar and tools"),
]

PYTHON_GUEST = """
    import tensorjob as tj

    def main(input):
        reply = tj.infer(input.get("prompt", "the cat"), max_tokens=input.get("max_tokens", 32), **input["constraint"])
        pieces = list(reply) if input.get("stream") else None   # token by token, or the whole answer at once
        return {"text": reply.text, "pieces": pieces}
"""

C_GUEST = r"""
#include "tensorjob.h"

static tj_str choices[16];

tj_cmd guest_init(tj_json input) {
    tj_str prompt = tj_get_str(input, "prompt");
    uint32_t max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 32);
    tj_json constraint = tj_get(input, "constraint");
    tj_str regex = tj_get_str(constraint, "regex"), grammar = tj_get_str(constraint, "grammar");
    if (regex.ptr) return tj_infer_regex(prompt, max_tokens, regex);
    if (grammar.ptr) return tj_infer_grammar(prompt, max_tokens, grammar);
    size_t n = 0;
    tj_iter it = tj_iter_of(tj_get(constraint, "choices"));
    tj_str key;
    tj_json choice;
    while (n < 16 && tj_next(&it, &key, &choice)) choices[n++] = tj_as_str(choice);
    return tj_infer_choices(prompt, max_tokens, choices, n);
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_INFER_DONE) return tj_failf("unsupported", "unexpected event %S", ev.name);
    return tj_done(tj_jsonf("{\"text\":%S}", ev.text));
}
"""

ZIG_GUEST = """
const tj = @import("tensorjob");

pub const Constraint = struct {
    regex: ?[]const u8 = null,
    choices: ?[]const []const u8 = null,
    grammar: ?[]const u8 = null,
};
pub const Input = struct { prompt: []const u8 = "", max_tokens: u32 = 32, constraint: Constraint = .{} };

pub fn init(input: Input) !tj.Command {
    const c = input.constraint;
    return tj.inferWith(input.prompt, input.max_tokens,
        .{ .regex = c.regex, .choices = c.choices, .grammar = c.grammar });
}

pub fn step(ev: tj.Event) !tj.Command {
    return switch (ev) {
        .infer_done => |d| tj.done(.{ .text = d.text }),
        else => tj.fail("unsupported", "unexpected event"),
    };
}

comptime {
    tj.exportGuest(@This());
}
"""


def satisfies(kind: str, text: str) -> bool:
    return re.fullmatch(KINDS[kind][1], text) is not None


def constraint(kind: str) -> dict:
    return {kind: KINDS[kind][0]}


@pytest.fixture(scope="module")
def python_guests():
    ensure_interpreter()


@pytest.fixture(scope="module")
def tiny(tiny_files):  # noqa: F811
    """The worker serving the tiny random-weight model: real constrained decoding in milliseconds."""
    from tensorjob_jupyter.inference.models import get_backend

    return get_backend(tiny_files["model"])


@pytest.fixture(scope="module")
def guests():
    return {"python": GuestSource.from_text(src(PYTHON_GUEST), lang="python", name="constrained"),
            "c": GuestSource.from_text(C_GUEST, lang="c", name="constrained"),
            "zig": GuestSource.from_text(ZIG_GUEST, lang="zig", name="constrained")}


def run(guest, input, backend, tmp_path, **kwargs) -> tuple[tj.Job, tj.Envelope]:
    job = tj.Job(guest, input=input, backend=backend, runs_dir=tmp_path / "runs", **kwargs).start()
    return job, job.wait(timeout=300)


def events(job, kind: str) -> list[dict]:
    return [e for e in job.events if e["type"] == kind]


def assert_answer_held(job, env, kind: str) -> str:
    """The job's answer satisfies ``kind``'s constraint, streamed as it was returned, and reported as asked."""
    assert env.ok, env
    text = env.result["text"]
    assert satisfies(kind, text), (kind, text)
    assert "".join(e["delta"] for e in events(job, "response.output_text.delta")) == text
    (created,) = events(job, "response.created")
    assert created["command"][kind] == KINDS[kind][0]  # the infer as the host parsed it
    (completed,) = events(job, "response.completed")
    for response in (created["response"], completed["response"]):
        assert response[kind] == KINDS[kind][0]  # what held the answer, beside text.format
        assert response["text"]["format"] == {"type": "text"}
    return text


# --- each kind, from each guest language, on the tiny model ------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_python_guest_gets_an_answer_that_satisfies_each_kind(kind, stream, python_guests, guests, tiny, tmp_path):
    job, env = run(guests["python"], {"constraint": constraint(kind), "stream": stream}, tiny, tmp_path)
    text = assert_answer_held(job, env, kind)
    if stream:
        assert "".join(env.result["pieces"]) == text and len(env.result["pieces"]) >= 1


@pytest.mark.parametrize("lang", ["c", "zig"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_compiled_guest_gets_an_answer_that_satisfies_each_kind(kind, lang, guests, tiny, tmp_path):
    job, env = run(guests[lang], {"prompt": "the cat", "constraint": constraint(kind)}, tiny, tmp_path)
    assert_answer_held(job, env, kind)


# --- the SDKs write exactly the ABI's fields ----------------------------------------------------------------

#: Values whose escaping matters: quotes, backslashes, newlines, non-ASCII.
TRICKY = {
    "regex": r'"[^"\\]{1,8}"\.\d+ é',
    "choices": ['say "yes"', "back\\slash", "new\nline", "日本"],
    "grammar": 'start: "a\\"b" | /[é-ë]+/\n// a comment\n',
}


@pytest.mark.parametrize("lang", ["c", "zig"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_sdk_builders_write_each_field_exactly(kind, lang):
    wasm = tjc.compile_source(C_GUEST if lang == "c" else ZIG_GUEST, lang, filename=f"constrained_{lang}")
    raw = RawGuest(wasm).init({"prompt": "p", "max_tokens": 8, "constraint": {kind: TRICKY[kind]}})
    expected = {"cmd": "infer", "prompt": "p", "max_tokens": 8, "images": [], kind: TRICKY[kind]}
    assert json.loads(raw) == expected
    assert list(json.loads(raw)) == list(expected)  # the ABI's field order
    assert abi.command_from_json(json.loads(raw)).to_json() == expected  # the host's strict parser takes it


def test_the_c_header_helpers_are_the_members_tj_infer_with_would_add():
    source = r"""
    #include "tensorjob.h"
    static tj_json command(tj_cmd c) { return (tj_json){c.json, c.len}; }
    tj_cmd guest_init(tj_json input) {
        tj_str p = TJ_STR("p"), labels[] = {TJ_STR("a"), TJ_STR("b")};
        return tj_done(tj_jsonf("[[%j,%j],[%j,%j],[%j,%j]]",
            command(tj_infer_regex(p, 4, TJ_STR("x+"))),
            command(tj_infer_with(p, 4, tj_jsonf("{\"regex\":\"x+\"}"))),
            command(tj_infer_choices(p, 4, labels, 2)),
            command(tj_infer_with(p, 4, tj_jsonf("{\"choices\":[\"a\",\"b\"]}"))),
            command(tj_infer_grammar(p, 4, TJ_STR("start: \"a\""))),
            command(tj_infer_with(p, 4, tj_jsonf("{\"grammar\":%s}", "start: \"a\"")))));
    }
    tj_cmd guest_step(tj_event ev) { return tj_fail("unsupported", ev.name); }
    """
    raw = RawGuest(tjc.compile_source(src(source), "c", filename="helpers_vs_with")).init({})
    pairs = json.loads(raw)["result"]
    assert all(helper == with_members for helper, with_members in pairs), pairs
    assert [helper for helper, _ in pairs] == [
        {"cmd": "infer", "prompt": "p", "max_tokens": 4, "images": [], "regex": "x+"},
        {"cmd": "infer", "prompt": "p", "max_tokens": 4, "images": [], "choices": ["a", "b"]},
        {"cmd": "infer", "prompt": "p", "max_tokens": 4, "images": [], "grammar": 'start: "a"'}]


def test_tj_infer_in_python_writes_each_field_and_rejects_wrong_types(python_guests):
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.infer("p", max_tokens=8, regex="[0-9]+").text
            tj.infer("p", max_tokens=8, choices=("a", "b")).text      # any sequence of str
            tj.infer("p", max_tokens=8, grammar='start: "a"').text
            errors = []
            for bad in ({"regex": 5}, {"grammar": b"start"}, {"choices": "yes"}, {"choices": ["a", 1]}):
                try:
                    tj.infer("p", **bad)
                except TypeError as e:
                    errors.append(str(e))
            return errors
    """)
    assert [c.to_json() for c in out.commands] == [
        {"cmd": "infer", "prompt": "p", "max_tokens": 8, "images": [], "regex": "[0-9]+"},
        {"cmd": "infer", "prompt": "p", "max_tokens": 8, "images": [], "choices": ["a", "b"]},
        {"cmd": "infer", "prompt": "p", "max_tokens": 8, "images": [], "grammar": 'start: "a"'},
    ]
    assert out.result == ["infer() regex must be str, not int", "infer() grammar must be str, not bytes",
                          "infer() choices must be a list of str, not str",
                          "infer() choices must be a list of str, not a list holding int"]


# --- refusals: one line, before any token ----------------------------------------------------------------


@pytest.mark.parametrize("lang", ["python", "c"])
@pytest.mark.parametrize("asked, says", REFUSED, ids=["bad-regex", "undefined-rule", "two-kinds"])
def test_what_cannot_be_enforced_fails_the_job_in_one_line_before_any_token(asked, says, lang, python_guests,
                                                                             guests, tmp_path):
    if lang == "c" and len(asked) > 1:  # the C guest sends one kind; two at once come from tj_infer_with
        asked_guest = GuestSource.from_text(src(r"""
            #include "tensorjob.h"
            tj_cmd guest_init(tj_json input) { return tj_infer_with(TJ_STR("p"), 8, tj_get(input, "constraint")); }
            tj_cmd guest_step(tj_event ev) { return tj_done(tj_jsonf("%S", ev.text)); }
        """), lang="c", name="infer_with")
    else:
        asked_guest = guests[lang]
    backend = ScriptedBackend("positive")
    job, env = run(asked_guest, {"prompt": "p", "constraint": asked}, backend, tmp_path)
    assert env.error is not None and env.error.code == codes.SCHEMA_VALIDATION_FAILED, env
    message = env.error.message
    assert "\n" not in message and says in message and len(message) < 600, message
    assert backend.scripted.prompts == []  # refused before the model was asked
    assert not events(job, "response.output_text.delta")


def test_empty_choices_are_a_malformed_command_naming_the_field(python_guests, guests, tmp_path):
    """An empty list is not a constraint at all: the ABI refuses the command (a C guest traps; in Python it is
    the guest's own ValueError, at its line)."""
    backend = ScriptedBackend("positive")
    _, env = run(guests["c"], {"prompt": "p", "constraint": {"choices": []}}, backend, tmp_path)
    assert env.error.code == codes.WASM_TRAP
    assert "`infer.choices` must be a non-empty array" in env.error.message and "\n" not in env.error.message
    _, env = run(guests["python"], {"constraint": {"choices": []}}, backend, tmp_path)
    assert env.error.code == codes.SCRIPT_ERROR
    last = env.error.message.strip().splitlines()[-1]
    assert last.startswith("ValueError: `infer.choices` must be a non-empty array"), env.error.message
    assert backend.scripted.prompts == []


def test_an_answer_that_breaks_the_constraint_fails_the_job(guests, tmp_path):
    """A model that did not enforce the constraint (here a scripted one) is caught by the check of the answer."""
    for kind, wrong in [("regex", "2024-1-1"), ("choices", "maybe"), ("grammar", "yes,7")]:
        _, env = run(guests["c"], {"prompt": "p", "constraint": constraint(kind)}, ScriptedBackend(wrong), tmp_path)
        assert env.error.code == codes.SCHEMA_VALIDATION_FAILED, env
        assert "does not match" in env.error.message and "\n" not in env.error.message
    _, env = run(guests["c"], {"prompt": "p", "constraint": constraint("choices")}, ScriptedBackend("neutral"),
                 tmp_path)
    assert env.ok and env.result == {"text": "neutral"}


def test_an_answer_cut_short_by_max_tokens_is_limit_exceeded(guests, tiny, tmp_path):
    """Ten characters of date cannot fit in three tokens of a byte-level model: the job says to raise max_tokens."""
    _, env = run(guests["c"], {"prompt": "the cat", "max_tokens": 3, "constraint": constraint("regex")}, tiny,
                 tmp_path)
    assert env.error.code == codes.LIMIT_EXCEEDED and "max_tokens" in env.error.message, env


# --- the command line, in a subprocess: guests/examples/classify.c -------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


LINES = ["The soup was wonderful and warm.", "", "Service was slow; the bread was stale.", "It was a restaurant."]


def classify_input(tmp_path: Path, **fields) -> tuple[Path, str]:
    doc = tmp_path / "docs" / "reviews.txt"
    doc.parent.mkdir(exist_ok=True)
    doc.write_text("\n".join(LINES) + "\n")
    return doc, json.dumps({"path": str(doc), **fields})


def assert_classified(result: dict, doc: Path, kind: str) -> None:
    assert result["path"] == str(doc)
    assert [line["line"] for line in result["lines"]] == [1, 3, 4]  # the blank line 2 is skipped
    labels = [line["label"] for line in result["lines"]]
    assert all(satisfies(kind, label) for label in labels), labels
    assert sum(result["counts"].values()) == 3 and set(result["counts"]) == set(labels)


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
@pytest.mark.parametrize("kind", KINDS)
def test_classify_c_from_the_cli_labels_each_line_as_asked(kind, tiny_files, tmp_path):  # noqa: F811
    field = {"regex": "regex", "choices": "labels", "grammar": "grammar"}[kind]
    doc, given = classify_input(tmp_path, **{field: KINDS[kind][0]})
    proc = cli(str(CLASSIFY), "--read", str(doc.parent), "--input", given, "--model", str(tiny_files["model"]),
               "--runs", str(tmp_path / "runs"), "--json", "--quiet", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    envelope = json.loads(proc.stdout)
    assert envelope["status"] == "completed"
    assert_classified(envelope["result"], doc, kind)


@pytest.mark.parametrize("asked, says", [({"regex": "[a-"}, "regex"), ({"grammar": "start: answer"}, "answer")],
                         ids=["bad-regex", "undefined-rule"])
def test_the_cli_refuses_what_cannot_be_enforced_in_one_line_and_exits_non_zero(asked, says, tiny_files,  # noqa: F811
                                                                               tmp_path):
    doc, given = classify_input(tmp_path, **asked)
    proc = cli(str(CLASSIFY), "--read", str(doc.parent), "--input", given, "--model", str(tiny_files["model"]),
               "--runs", str(tmp_path / "runs"), "--json", cwd=ROOT)
    assert proc.returncode == 1
    refused = [line for line in proc.stderr.splitlines() if codes.SCHEMA_VALIDATION_FAILED in line]
    assert len(refused) == 1 and says in refused[0], proc.stderr  # the terminal's one line
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == codes.SCHEMA_VALIDATION_FAILED and says in error["message"]
    assert "\n" not in error["message"] and error["message"] in refused[0]


# --- the embedded model -------------------------------------------------------------------------------------

PROMPTS = ["Is the sky blue?", "What is 2 + 2?", "How do you feel about rainy days?"]
#: For a model that writes words: bounded, so no answer can run past max_tokens.
WORDY = {
    "regex": (r"[0-9]{1,4}(\.[0-9]{1,2})?", r"[0-9]{1,4}(\.[0-9]{1,2})?"),
    "choices": (["yes", "no", "maybe"], r"yes|no|maybe"),
    "grammar": ('start: ("yes" | "no") ", because " /[a-z ]{1,40}/', r"(yes|no), because [a-z ]{1,40}"),
}


@pytest.mark.slow
def test_the_embedded_model_answers_each_kind_from_a_python_guest(python_guests, smollm, tmp_path):  # noqa: F811
    guest = GuestSource.from_text(src("""
        import tensorjob as tj

        def main(input):
            out = []
            for prompt in input["prompts"]:
                for kind, value in input["kinds"].items():
                    out.append([kind, tj.infer(prompt, max_tokens=64, **{kind: value}).text])
            return out
    """), lang="python", name="every_kind")
    kinds = {kind: value for kind, (value, _) in WORDY.items()}
    job, env = run(guest, {"prompts": PROMPTS, "kinds": kinds}, smollm, tmp_path)
    assert env.ok, env
    assert len(env.result) == len(PROMPTS) * len(WORDY)
    for kind, text in env.result:
        assert re.fullmatch(WORDY[kind][1], text), (kind, text)
    assert len(events(job, "response.completed")) == len(env.result)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_classify_c_labels_every_line_on_the_embedded_model(kind, smollm, tmp_path):  # noqa: F811
    field = {"regex": "regex", "choices": "labels", "grammar": "grammar"}[kind]
    doc = tmp_path / "reviews.txt"
    doc.write_text("\n".join(LINES) + "\n")
    _, env = run(CLASSIFY, {"path": str(doc), field: KINDS[kind][0]}, smollm, tmp_path, read=[str(tmp_path)])
    assert env.ok, env
    assert_classified(env.result, doc, kind)


@pytest.mark.slow
def test_the_cli_classifies_a_file_on_the_embedded_model(tmp_path):
    doc, given = classify_input(tmp_path)  # the default labels: positive, negative, neutral
    proc = cli(str(CLASSIFY), "--read", str(doc.parent), "--input", given, "--runs", str(tmp_path / "runs"),
               "--json", "--quiet", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert_classified(json.loads(proc.stdout)["result"], doc, "choices")
