"""``tensorjob review RUN_DIR``: a map's values reviewed in the terminal, one at a time -- a leaf over ``ReviewQueue``.

    tensorjob review RUN_DIR [--confidence 0.95] [--target 0.95]

Each value is shown with its item, field, confidence, what its sources say, the label it stood under and the text
around it; a line answers it: Enter or ``a`` accepts, ``c`` types a correction, ``n`` sets it null, ``s`` skips,
``b`` goes back, ``q`` quits. Each decision goes to the run folder at once (``reviews.jsonl``), so a review
stopped anywhere -- ``q``, Ctrl-C, Ctrl-D -- resumes where it was; the certificate of the values nobody reviewed
is printed as it changes and at the end. Everything shown is made inert (``text.for_terminal``).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from tensorjob_jupyter.fanout.certify import DEFAULT_CONFIDENCE, Certificate
from tensorjob_jupyter.fanout.reviews import ACCEPT, CORRECT, NULL, SKIP, typed_correction
from tensorjob_jupyter.fanout.review_queue import QueueItem, ReviewQueue
from tensorjob_jupyter.frontends.options import EXIT_OK, OptionError
from tensorjob_jupyter.text import clip, for_terminal

#: What each answer does; Enter alone accepts.
KEYS = {"": ACCEPT, "a": ACCEPT, "c": CORRECT, "n": NULL, "s": SKIP, "b": "back", "q": "quit"}
PROMPT = "[a]ccept (Enter)  [c]orrect  [n]ull  [s]kip  [b]ack  [q]uit > "
#: Characters of a value or a context shown.
SHOWN_CHARS = 300


def add_review_parser(sub) -> None:
    review = sub.add_parser(
        "review", help="review a map's values in the terminal, doubtful first, and certify the rest",
        description="Show a map's values one at a time -- the doubtful first (found in no window their item read, "
                    "then the least confident), with a random sample of the rest beside them -- and record each "
                    "decision (accept, correct, null, skip) in the run folder's reviews.jsonl. Resumable: values "
                    "decided already are not asked again. The sample certifies the values nobody reviewed: a lower "
                    "bound on their accuracy (a confidence sequence, valid wherever the review stops), kept in "
                    "certificate.json.")
    review.add_argument("run_dir", metavar="RUN_DIR", help="a map's run folder")
    review.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, metavar="C",
                        help=f"how sure the certificate's bound is (default {DEFAULT_CONFIDENCE})")
    review.add_argument("--target", type=float, default=None, metavar="T",
                        help="stop asking once the values nobody reviewed are at least this share right (0.95: 95%%) "
                             "at --confidence; says how many more reviews that needs")


def _shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return for_terminal(clip(text, limit), one_line=True)


def _key(key: str, limit: int = 60) -> str:
    """An item's key on one line, its end kept where it is long (a path's file name)."""
    text = for_terminal(key, one_line=True)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def show_value(item: QueueItem, number: int, total: int, out: TextIO) -> None:
    """One value as the reviewer sees it (never whether it was sampled)."""
    row = item.row
    sure = f"confidence {row.confidence:.3f}" if row.confidence is not None else "no confidence"
    found = row.found or ("null" if row.value is None else "not located")
    out.write(f"\n[{number}/{total}] item {row.item} ({_key(row.key)}) · {_shown(row.field, 80)}  "
              f"{row.reason} · {found} · {sure}\n")
    out.write(f"  value: {_shown(row.value) if row.value is not None else 'null'}\n")
    if row.source is not None:
        label = f" under «{_shown(row.label, 60)}»" if row.label else ""
        out.write(f"  source: {_shown(row.source, 120)}{label}\n")
    if row.context is not None:
        out.write(f"  {_shown(row.context)}\n")
    if item.review is not None:
        decided = item.review.decision + (f" {_shown(item.review.final)}" if item.review.decision == CORRECT else "")
        out.write(f"  decided: {decided}\n")


def _read(inp: TextIO, out: TextIO, prompt: str) -> str | None:
    out.write(prompt)
    out.flush()
    line = inp.readline()
    return None if not line else line.rstrip("\r\n")


def review_loop(queue: ReviewQueue, inp: TextIO, out: TextIO) -> Certificate:
    """Ask about each value the queue gives until it has none, the reviewer quits or input ends; the
    certificate as it stands then."""
    item = queue.next()
    while item is not None:
        progress = queue.progress()
        show_value(item, progress.reviewed + 1, progress.values, out)
        answer = _read(inp, out, PROMPT)
        if answer is None:
            out.write("\n")
            break
        action = KEYS.get(answer.strip().lower())
        if action is None:
            out.write(f"  answer a, c, n, s, b or q (or Enter to accept), not {_shown(answer, 20)!r}\n")
            continue
        if action == "quit":
            break
        if action == "back":
            earlier = queue.back()
            if earlier is None:
                out.write("  this is the first value of this review\n")
            else:
                item = earlier
            continue
        corrected = None
        if action == CORRECT:
            typed = _read(inp, out, "  correct value (JSON, or text): ")
            if typed is None:
                out.write("\n")
                break
            corrected = typed_correction(typed, item.row.value)
        certificate = queue.decide(action, corrected)
        out.write(f"  {for_terminal(certificate.statement(), one_line=True)}\n")
        item = queue.next()
    else:
        if queue.certificate().reached:
            out.write("\nthe target is reached: no more values to ask\n")
        else:
            out.write("\nno more values to review\n")
    return queue.certificate()


def cmd_review(args, out: TextIO, err: TextIO, inp: TextIO | None = None) -> int:
    for name in ("confidence", "target"):
        value = getattr(args, name)
        if value is not None and not 0.0 < value < 1.0:
            raise OptionError(f"--{name} is a share strictly between 0 and 1 (0.95 is 95%), not {value}")
    queue = ReviewQueue(args.run_dir, confidence=args.confidence, target=args.target)
    try:
        certificate = review_loop(queue, inp or sys.stdin, out)
    except KeyboardInterrupt:
        out.write("\n")
        certificate = queue.certificate()
    out.write(f"{queue.progress()}\n")
    for line in certificate.lines():
        out.write(for_terminal(line, one_line=True) + "\n")
    if queue.stale:
        out.write(f"{len(queue.stale)} earlier reviews are of values that changed since (a replay or a resume): "
                  f"kept in reviews.jsonl, applied to nothing\n")
    return EXIT_OK


COMMANDS = {"review": cmd_review}


__all__ = ["KEYS", "PROMPT", "SHOWN_CHARS", "add_review_parser", "show_value", "review_loop", "cmd_review",
           "COMMANDS"]
