"""A cascade's panel in the map view: its phases, the sample so far, the threshold and the certified agreement.

``render_cascade`` draws what a ``CascadeRun`` says (its ``phase`` and its ``cascade.json`` record, ``state``) as
escaped HTML: the phases in order (proxy on every item, the sample on the oracle, the oracle below the threshold),
the one running marked, the sample's items done so far and, once compared, how many agreed; the threshold and its
lower bound once certified (or why none was); who answered how many items at the end. ``tier_mark`` is an item
row's tier (``answered_by``). Design: docs/maps.md#a-cascade-with-a-guarantee
"""

from __future__ import annotations

from typing import Any

from tensorjob_jupyter.fanout.cascade import ORACLE, PHASES, PROXY, SAMPLED
from tensorjob_jupyter.frontends.view.render import BLUE, GREEN, GREY, PURPLE, RED
from tensorjob_jupyter.text import for_html

__all__ = ["TIERS", "PHASE_TIERS", "tier_mark", "part", "render_cascade"]

#: Each tier (a record's ``answered_by``): its word in a row, its colour, and what it means.
TIERS = {PROXY: ("proxy", GREY, "answered by the proxy: its score was at or above the threshold"),
         SAMPLED: ("sampled", PURPLE, "in the sample: answered by the oracle, the proxy's answer compared and kept"),
         ORACLE: ("oracle", BLUE, "answered by the oracle: the proxy's score was under the threshold (its answer "
                                  "kept)")}
#: The tier an item's answer has while its phase runs (an item event's ``phase``).
PHASE_TIERS = {"proxy": PROXY, "sample": SAMPLED, "oracle": ORACLE}


def tier_mark(tier: Any) -> str:
    """A row's tier as a small coloured word (its meaning in the title); nothing for no tier."""
    if tier not in TIERS:
        return ""
    word, colour, meaning = TIERS[tier]
    return (f'<span class="tj-cascade-tier tj-tier-{word}" style="color:{colour};font-size:10px" '
            f'title="{for_html(meaning)}">{word}</span>')


def part(state: dict, key: str) -> dict | None:
    """``state[key]`` when it is a dict (a record's part), else None."""
    value = state.get(key)
    return value if isinstance(value, dict) else None


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def render_cascade(phase: str, state: dict, *, sample_done: int | None = None, ended: str | None = None) -> str:
    """The panel: ``phase`` (the run's now), ``state`` (its ``cascade.json`` record), ``sample_done`` (the sampled
    items the oracle has concluded so far, while the sample runs), ``ended`` (the run's status once it ended)."""
    s = part(state, "settings") or {}
    done = state.get("phase") == "done"
    order = list(PHASES)
    now = order.index(phase) if phase in order else 0
    steps = []
    for i, name in enumerate(order):
        if done or i < now:
            colour, mark, cls = GREEN, "✓", "tj-cascade-done"
        elif i == now and ended is None:
            colour, mark, cls = BLUE, "●", "tj-cascade-now"
        elif i == now and ended == "finished":
            colour, mark, cls = GREEN, "✓", "tj-cascade-done"
        elif i == now:
            colour, mark, cls = RED, "✗", "tj-cascade-ended"
        else:
            colour, mark, cls = GREY, "○", "tj-cascade-later"
        label = for_html(PHASES[name])
        steps.append(f'<span class="tj-cascade-phase {cls}" style="color:{colour}">{mark} '
                     + (f"<b>{label}</b>" if cls == "tj-cascade-now" else label) + "</span>")
    lines = [f'<div class="tj-cascade-phases">cascade: proxy <code>{for_html(str(state.get("proxy_model") or "?"))}'
             f'</code>, oracle <code>{for_html(str(s.get("oracle_model") or "?"))}</code> · '
             + " → ".join(steps) + "</div>"]
    sample = part(state, "sample")
    agreed = part(state, "agreement")
    if sample is not None:
        size = len(sample.get("items") or [])
        if agreed is not None:
            text = (f"sample: {agreed.get('agree')} of {agreed.get('sampled')} sampled items agreed with the "
                    f"{s.get('against', 'oracle')}")
        else:
            text = f"sample: {sample_done if sample_done is not None else 0} of {size} on the oracle so far"
        lines.append(f'<div class="tj-cascade-sample">{for_html(text)}</div>')
    cert = part(state, "certificate")
    target, delta = _number(s.get("target")), _number(s.get("delta"))
    if cert is not None:
        threshold, bound = _number(cert.get("threshold")), _number(cert.get("bound"))
        if threshold is None:
            text = f"no threshold certified: {' '.join(str(cert.get('reason') or '').split())[:300]}"
            colour = RED
        else:
            text = (f"threshold {threshold:.4g} certified: the {cert.get('above')} items scored at or above it "
                    f"agree with the {s.get('against', 'oracle')} on at least {_share(bound)} of them (target "
                    f"{_share(target)}) with probability at least {_share(None if delta is None else 1 - delta)}")
            colour = GREEN
        lines.append(f'<div class="tj-cascade-threshold" style="color:{colour}">{for_html(text)}</div>')
    answered = part(state, "answered")
    if answered is not None:
        total = state.get("items") or 0
        calls = answered.get("oracle_calls", 0)
        share = f" ({calls / total:.0%})" if type(total) is int and total > 0 and type(calls) is int else ""
        text = (f"answered: {answered.get(PROXY, 0)} by the proxy, {answered.get(ORACLE, 0)} by the oracle, "
                f"{answered.get(SAMPLED, 0)} sampled (both); oracle calls {calls} of {total}{share}")
        lines.append(f'<div class="tj-cascade-answered">{for_html(text)}</div>')
    return (f'<div class="tj-cascade" style="font-family:sans-serif;font-size:12px;margin:2px 0">'
            f'{"".join(lines)}</div>')
