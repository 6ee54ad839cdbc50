"""Making untrusted text and values safe for the place they are shown.

Every string a guest or a model produced is hostile: in a terminal it can move the cursor, rewrite lines or
forge one; in HTML it can carry markup and script; pretty-printed, a small nested value becomes megabytes.
The functions here -- ``for_terminal``, ``for_html``, ``clip``, ``bounded``, ``json_text`` -- are the only way
such text leaves the host.

Design: docs/internals/host.md#textpy
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

# ESC-based sequences: CSI (ESC [ ...), OSC (ESC ] ... BEL/ST), DCS/SOS/PM/APC
# strings, and two-byte escapes; then the 8-bit C1 forms of CSI and OSC.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x9d.*?(?:\x07|\x9c|$)",
    re.DOTALL,
)
# Bidirectional formatting controls: marks, embeddings, overrides, isolates.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# Remaining C0 controls except tab and newline, DEL, C1 controls and bidi controls.
_CONTROLS = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f\\x80-\\x9f{_BIDI}]")
# Line breaks a terminal or an editor may honour.
_LINE_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
# What json.dumps(ensure_ascii=False) leaves raw that a terminal may act on.
_JSON_UNSAFE = re.compile(f"[\\x7f-\\x9f{_BIDI}\u2028\u2029]")

#: Values larger than this (compact JSON, in characters) or deeper than
#: ``PRETTY_MAX_DEPTH`` are printed compact: indenting amplifies with depth.
PRETTY_MAX_CHARS = 16 * 1024
PRETTY_MAX_DEPTH = 16


def for_terminal(text: str, *, one_line: bool = False) -> str:
    """``text`` with every terminal control sequence and control character removed.

    ``one_line``: line breaks become ``⏎`` too, so the text cannot start a
    line that looks like the host's own.
    """
    if one_line:
        text = _LINE_BREAKS.sub("⏎", text)
    else:
        text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def for_html(text: str) -> str:
    """``text`` escaped for HTML content or a quoted attribute, controls removed."""
    return html.escape(for_terminal(text), quote=True)


def _depth_at_most(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def json_text(value: Any, *, pretty: bool = True) -> str:
    """JSON of ``value`` safe to print: indented only while that stays small, and
    with controls, bidi marks and line separators escaped inside strings."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if pretty and len(text) <= PRETTY_MAX_CHARS and _depth_at_most(value, PRETTY_MAX_DEPTH):
        text = json.dumps(value, ensure_ascii=False, indent=2)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# The bounds of ``bounded``: a debugger's pause, the view's JSON tree, a terminal line.
MAX_DEPTH = 12
MAX_CHILDREN = 100
MAX_NODES = 1000
MAX_STRING_CHARS = 2000
MAX_KEY_CHARS = 200
#: Characters of strings one bounded value keeps in all.
MAX_TOTAL_CHARS = 16 * 1024


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def bounded(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A copy of a JSON value cut to bounds whatever its size: at most ``MAX_DEPTH``
    levels, ``MAX_CHILDREN`` children a level, ``MAX_NODES`` values and
    ``MAX_TOTAL_CHARS`` characters of strings in all; what is cut is said
    (``"… 7 more items"``). Costs time in the bounds, not in the value's size."""
    if budget is None:
        budget = [MAX_NODES, MAX_TOTAL_CHARS]
    budget[0] -= 1
    if isinstance(value, str):
        limit = max(0, min(MAX_STRING_CHARS, budget[1]))
        budget[1] -= min(len(value), limit)
        return clip(value, limit)
    if isinstance(value, dict):
        if not value:
            return {}
        if depth >= MAX_DEPTH or budget[0] <= 0:
            return f"{{…}} {len(value)} keys"
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= MAX_CHILDREN or budget[0] <= 0:
                out["…"] = f"{len(value) - i} more keys"
                break
            out[clip(str(k), MAX_KEY_CHARS)] = bounded(v, depth + 1, budget)
        return out
    if isinstance(value, (list, tuple)):
        if not value:
            return []
        if depth >= MAX_DEPTH or budget[0] <= 0:
            return f"[…] {len(value)} items"
        items: list[Any] = []
        for v in value[:MAX_CHILDREN]:
            if budget[0] <= 0:
                break
            items.append(bounded(v, depth + 1, budget))
        if len(items) < len(value):
            items.append(f"… {len(value) - len(items)} more items")
        return items
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clip(repr(value), MAX_STRING_CHARS)  # pragma: no cover - JSON values only


__all__ = [
    "PRETTY_MAX_CHARS", "PRETTY_MAX_DEPTH", "for_terminal", "for_html", "json_text", "MAX_DEPTH", "MAX_CHILDREN",
    "MAX_NODES", "MAX_STRING_CHARS", "MAX_KEY_CHARS", "MAX_TOTAL_CHARS", "clip", "bounded"
]
