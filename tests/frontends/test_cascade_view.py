"""A cascade seen live: the map view's panel (the phases, the sample so far, the threshold and the certified
agreement), each row's tier, and the terminal's progress and summary saying the same -- on two scripted "models"
over ``guests/examples/extract.c``, as tests/fanout/test_cascade.py runs them, every text escaped."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.cascade import ORACLE, PROXY, SAMPLED, read_cascade
from tensorjob_jupyter.frontends.map_cli import ProgressPrinter, _summary_text
from tensorjob_jupyter.frontends.view.cascade_panel import render_cascade, tier_mark
from tensorjob_jupyter.inference import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]
EXTRACT = ROOT / "guests" / "examples" / "extract.c"
SCHEMA = {"type": "object", "properties": {"customer": {"type": "string"}, "order": {"type": "integer"}},
          "required": ["customer", "order"], "additionalProperties": False}
N = 40


def answer(prompt: str, *, proxy: bool) -> str:
    m = re.search(r"Customer (\S+ \S+) wrote about order (\d+)( \(hard\))?", prompt)
    name, order, hard = m.group(1), int(m.group(2)), bool(m.group(3))
    return json.dumps({"customer": "<b>Zed</b> Wrong" if proxy and hard else name, "order": order})


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A cascade started: a "small<i>" proxy wrong and unsure on every fourth note, a "big" oracle always right.
    The items name their notes relative to the folder the test runs in, so the manifest -- and the sample it seeds
    -- is the same on every run: with a sample drawn afresh, one holding three hard notes or fewer of ten certified
    every item (17 of 20 agreeing bound 0.72 over the target) and left the oracle phase empty, about one run in six."""
    monkeypatch.chdir(tmp_path)
    folder = Path("notes")
    folder.mkdir()
    items = []
    for i in range(N):
        hard = " (hard)" if i % 4 == 0 else ""
        (folder / f"n{i}.txt").write_text(f"Customer Ada{i} Okafor wrote about order {10000 + i}{hard}.")
        items.append({"path": str(folder / f"n{i}.txt"), "schema": SCHEMA, "max_tokens": 48})
    small = ScriptedBackend(lambda p: answer(p, proxy=True), model_name="small<i>",
                            logprobs=lambda i, piece: -2.5 if "Zed" in piece or "Wrong" in piece else -0.01)
    big = ScriptedBackend(lambda p: answer(p, proxy=False), model_name="big", logprobs=-0.01)
    return tj.start_map(EXTRACT, items, tmp_path / "run", read=[folder], backend=small, cascade=big, target=0.7,
                        cascade_sample=20)


def test_the_map_view_shows_the_phases_the_sample_so_far_the_threshold_and_each_items_tier(started):
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    run = started
    view = MapView(run, "extract.c", refresh_hz=20)
    seen: dict[str, str] = {}

    def snapshot(event: dict) -> None:  # on the cascade's thread, as each phase's first item concludes
        phase = event.get("phase")
        if event["type"] == "item.completed" and phase not in seen:
            seen[phase] = view._cascade_html(run.progress())

    run.subscribe(snapshot)
    view.start()
    result = run.wait(60)
    view.join(10)
    assert result.status == "finished" and result.completed == N, result
    assert set(seen) == {"proxy", "sample", "oracle"}, seen.keys()
    assert re.search(r"tj-cascade-now[^>]*>● <b>proxy on every item</b>", seen["proxy"])
    assert "tj-cascade-sample" not in seen["proxy"] and "tj-cascade-threshold" not in seen["proxy"]
    assert re.search(r"tj-cascade-done[^>]*>✓ proxy on every item", seen["sample"])
    assert "<b>sample on the oracle</b>" in seen["sample"]
    assert re.search(r"sample: [01] of 20 on the oracle so far", seen["sample"]), seen["sample"]
    assert "<b>oracle below the threshold</b>" in seen["oracle"] and "certified" in seen["oracle"]
    state = read_cascade(result.run_dir)
    agreed = state["agreement"]["agree"]
    assert f"sample: {agreed} of 20 sampled items agreed with the oracle" in seen["oracle"]
    final = view.cascade.value
    assert final == view._cascade_html(run.progress()) and final in view.static_html()
    assert final.count("tj-cascade-done") == 4 and "tj-cascade-now" not in final
    assert f"threshold {state['certificate']['threshold']:.4g} certified" in final
    assert f"at least {state['certificate']['bound']:.3g} of them (target 0.7)" in final
    answered = state["answered"]
    assert (f"answered: {answered[PROXY]} by the proxy, {answered[ORACLE]} by the oracle, {answered[SAMPLED]} "
            f"sampled (both)") in final
    assert "small&lt;i&gt;" in final and "small<i>" not in final  # the model's name, escaped
    items = view.items.value  # the finished view: every item once, with who answered it
    tiers = re.findall(r'<td class="tj-map-item-number"[^>]*>(\d+)</td>.*?tj-tier-(\w+)', items)
    assert [int(i) for i, _ in tiers] == list(range(N))
    by_row = {r["item"]: r["answered_by"] for r in result.rows()}
    word = {PROXY: "proxy", ORACLE: "oracle", SAMPLED: "sampled"}
    assert {int(i): t for i, t in tiers} == {i: word[t] for i, t in by_row.items()}
    assert "<b>Zed" not in items  # a hard note's oracle answer shown; nothing unescaped anyway


def test_the_terminal_names_each_phase_and_ends_with_the_same_summary(started):
    err = io.StringIO()
    started.subscribe(ProgressPrinter(err, quiet=False, every_s=0.0))
    result = started.wait(60)
    lines = err.getvalue().splitlines()
    phases = [line.split(":")[0] for line in lines if line.startswith("· ") and ":" in line.split("(")[0]]
    assert phases[0] == "· proxy on every item" and "· sample on the oracle" in phases
    assert "· oracle below the threshold" in phases or read_cascade(result.run_dir)["oracle_items"] == 0
    assert phases == sorted(phases, key=["· proxy on every item", "· sample on the oracle",
                                         "· oracle below the threshold"].index)  # one phase after another
    state = read_cascade(result.run_dir)
    said = next(line for line in lines if "certified" in line)
    assert f"the sample agreed with the oracle on {state['agreement']['agree']} of 20 items" in said
    summary = _summary_text(result)
    assert "cascade: proxy small<i>, oracle big" in summary
    assert f"oracle calls {state['answered']['oracle_calls']} of {N} items" in summary


def test_the_panel_escapes_every_text_and_says_when_no_threshold_was_certified():
    hostile = "<script>alert(1)</script>"
    state = {"proxy_model": hostile, "items": 3, "phase": "oracle",
             "settings": {"oracle_model": hostile, "target": 0.9, "delta": 0.1, "against": "oracle"},
             "sample": {"items": [0, 1]}, "agreement": {"sampled": 2, "agree": 1},
             "certificate": {"threshold": None, "reason": f"too few items {hostile}"}}
    html = render_cascade("oracle", state, ended="error")
    assert "<script" not in html and html.count("&lt;script&gt;") == 3
    assert "no threshold certified: too few items" in html and "tj-cascade-ended" in html
    assert render_cascade("proxy", {"settings": "not a dict", "sample": [1]}).count("tj-cascade-later") == 3
    assert tier_mark("nobody") == "" and "sampled" in tier_mark(SAMPLED)
