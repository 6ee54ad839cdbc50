"""``tensorjob review RUN_DIR`` as a person uses it: a subprocess in a pseudo-terminal (pexpect), answered key by
key -- accept with Enter, a typed correction, null, skip, back, quit -- then started again to resume; and with
``--target``, until the certificate reaches it. What each decision left is read back from the run folder."""

from __future__ import annotations

import json
import sys

import pexpect
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.certify import PLAN_FORMAT
from tensorjob_jupyter.fanout.map_folder_reader import REVIEW_PLAN
from test_review import invoice_map, truth

PROMPT = r"\[q\]uit > "


@pytest.fixture
def run(tmp_path):
    result = invoice_map(tmp_path, 6)
    assert result.completed == 6
    return result.run_dir


def review(run, *flags, timeout=60):
    return pexpect.spawn(sys.executable, ["-m", "tensorjob_jupyter.frontends.cli", "review", str(run), *flags],
                         encoding="utf-8", timeout=timeout, dimensions=(40, 160))


def shown_value(child) -> tuple[int, str]:
    """The item and field of the value on screen (after its heading)."""
    child.expect(r"\[\d+/\d+\] item (\d+) \([^)]*\) · (\S+)")
    return int(child.match.group(1)), child.match.group(2)


def test_a_person_reviews_values_one_at_a_time_and_resumes_where_they_were(run):
    child = review(run)
    decided = {}
    item, field = shown_value(child)
    child.expect(PROMPT)
    child.sendline("")  # Enter accepts
    decided[(item, field)] = "accept"
    child.expect("values? not reviewed")
    item, field = shown_value(child)
    child.expect(PROMPT)
    child.sendline("c")
    child.expect("correct value")
    child.sendline("Typed Value")
    decided[(item, field)] = "correct"
    item, field = shown_value(child)
    child.expect(PROMPT)
    child.sendline("n")
    decided[(item, field)] = "null"
    item, field = shown_value(child)
    child.expect(PROMPT)
    child.sendline("x")  # not an answer: said so, the same value again
    child.expect("answer a, c, n, s, b or q")
    assert shown_value(child) == (item, field)
    child.expect(PROMPT)
    child.sendline("s")
    skipped = (item, field)
    after_skip = shown_value(child)
    child.expect(PROMPT)
    child.sendline("b")  # back: the skipped value again
    assert shown_value(child) == skipped
    child.expect(PROMPT)
    child.sendline("a")
    decided[skipped] = "accept"
    assert shown_value(child) == after_skip
    child.expect(PROMPT)
    child.sendline("q")
    child.expect(r"4 of 18 values reviewed, \d corrected")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    book = tj.MapResult.read(run).review_book()
    assert {place: r.decision for place, r in book.decided.items()} == decided
    corrected = next(r for r in book.decided.values() if r.decision == "correct")
    assert corrected.final == "Typed Value" or isinstance(corrected.value, (int, float))  # a number stays one
    assert json.loads((run / "certificate.json").read_text())["overall"]["reviewed"] == 4

    again = review(run)  # resumed: the decided values are not asked again
    seen = []
    for _ in range(3):
        seen.append(shown_value(again))
        again.expect(PROMPT)
        again.sendline("a")
    again.sendeof()
    again.expect(pexpect.EOF)
    again.close()
    assert again.exitstatus == 0 and not set(seen) & set(decided)
    assert len(tj.MapResult.read(run).review_book().decided) == 7


def test_with_a_target_it_stops_asking_once_the_certificate_reaches_it(tmp_path):
    run = invoice_map(tmp_path, 12).run_dir
    # the folder's sample seed, fixed (drawn at random, about one seed in six puts the sample where this small map's
    # certificate reaches the target only once every value is reviewed)
    (run / REVIEW_PLAN).write_text(json.dumps({"format": PLAN_FORMAT, "seed": 2}) + "\n")
    child = review(run, "--target", "0.3", "--confidence", "0.9")
    asked = 0
    while True:
        index = child.expect([r"\[\d+/\d+\] item (\d+) \([^)]*\) · (\S+)", "the target is reached", pexpect.EOF])
        if index != 0:
            break
        item, field = int(child.match.group(1)), child.match.group(2)
        child.expect(PROMPT)
        want = truth(item)[field]
        row = next(r for r in tj.MapResult.read(run).review_values(context=False)
                   if (r.item, r.field) == (item, field))
        if row.value == want:
            child.sendline("a")
        elif want is None:
            child.sendline("n")
        else:
            child.sendline("c")
            child.expect("correct value")
            child.sendline(json.dumps(want) if not isinstance(want, str) else want)
        asked += 1
    assert index == 1, child.before
    child.expect("target 30% reached")
    child.expect(pexpect.EOF)
    assert 0 < asked < 36
    certificate = tj.MapResult.read(run).certificate()
    assert certificate.reached and certificate.confidence == 0.9


def test_a_bad_confidence_or_folder_is_one_line_and_exit_2(run, tmp_path):
    from tensorjob_jupyter.frontends.cli import main
    import io
    for argv, words in [(["review", str(run), "--confidence", "1.5"], "--confidence is a share strictly between"),
                        (["review", str(tmp_path / "nowhere")], "is not a map's run folder")]:
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, out=out, err=err) == 2
        assert err.getvalue().count("\n") == 1 and words in err.getvalue(), err.getvalue()
