"""HTML for each section of the job view, built from a ``ViewState``.

Every string that came from a guest or a model -- tokens, paths, previews,
page text, emitted payloads, streamed output, the result, error messages --
passes through ``text.for_html`` before it is placed in markup, so a guest
that emits ``<script>`` shows the characters ``<script>``. Thumbnails of the
images a guest made are PNG bytes (checked by signature and size when the
event is folded in) re-encoded as base64 here, so only base64 reaches the
``src`` attribute. The debug panel (a paused job's command, the event that
answered the last one, handles, memory) shows guest-made values only through
the same bounded, escaped ``json_tree``. Markup built here uses
inline styles only (no script, no external resources), so it renders the
same in JupyterLab, Notebook, VS Code and nbconvert's HTML; ``static`` puts
every section together as the view a notebook keeps once the job has ended.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from tensorjob_jupyter.text import clip, for_html
from tensorjob_jupyter.frontends.view.state import FileState, ViewState
from tensorjob_jupyter.frontends.view.summary import error_text

# The palette: every colour of the job and map views, defined once.
BLUE = "#1f6feb"
GREEN = "#1a7f37"
RED = "#cf222e"
AMBER = "#9a6700"
GREY = "#57606a"
LIGHT_GREY = "#d0d7de"
PALE = "#f6f8fa"
#: A job's statuses (running, completed, failed, cancelled) and a map's (finished, error).
PURPLE = "#8250df"
STATUS_COLOURS = {"running": BLUE, "completed": GREEN, "finished": GREEN, "failed": RED, "error": RED,
                  "cancelled": AMBER, "paused": PURPLE}
PRE = "white-space:pre-wrap;word-break:break-word;margin:0;font-size:12px;"
MAX_HEX_BYTES = 128
#: Bounds of the result's JSON tree: it renders in time and size independent of the value.
TREE_MAX_DEPTH = 12
TREE_MAX_CHILDREN = 100
TREE_MAX_NODES = 1000
TREE_MAX_CHARS = 2000


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def status_badge(status: str) -> str:
    """The status as a coloured pill (``class="tj-status"``), for job and map headers alike."""
    colour = STATUS_COLOURS.get(status, GREY)
    return (f'<span style="background:{colour};color:white;border-radius:4px;padding:1px 6px" '
            f'class="tj-status">{for_html(status)}</span>')


def header(state: ViewState) -> str:
    rate = state.tokens_per_second
    bits = [f"{state.elapsed_s:.1f} s"]
    if state.tokens:
        bits.append(f"{state.tokens} tokens")
    if rate is not None:
        bits.append(f"{rate:.1f} tok/s")
    status = "paused" if state.paused and not state.done else state.status
    busy = (f' <span class="tj-busy" style="color:{AMBER}" title="{for_html(state.busy_machine)}">'
            f'· machine busy</span>' if state.busy_machine else "")
    return (f'<div style="font-family:sans-serif"><b>tensorjob</b> {for_html(state.name)} '
            f'{status_badge(status)} '
            f'<span class="tj-elapsed" style="color:{GREY}">{" · ".join(bits)}</span>{busy}</div>')


def log(state: ViewState) -> str:
    if not state.log:
        return ""
    lines = "\n".join(for_html(line) for line in state.log)
    return f'<pre class="tj-log" style="{PRE}color:{GREY}">{lines}</pre>'


def tokens(state: ViewState) -> str:
    blocks = []
    for infer in state.infers:
        note = infer.status if infer.reason is None else f"{infer.status}: {infer.reason}"
        kind = {"json": " · JSON", "call": " · tool call"}.get(infer.kind, "")
        head = (f'<div style="color:{GREY};font-size:11px">infer {infer.index + 1}{kind} · {infer.tokens} tokens · '
                f'{for_html(note)}</div>')
        if infer.kind == "call":
            head += (f'<div class="tj-call" style="font-family:monospace;font-size:12px">call '
                     f'<b>{for_html(infer.call_name or "")}</b></div>')
        if infer.has_value:  # a finished structured answer or call: its JSON as a tree
            body = (f'<div class="tj-json" style="font-family:monospace;font-size:12px;line-height:1.4">'
                    f'{json_tree(infer.value)}</div>')
        else:
            body = f'<pre class="tj-tokens" style="{PRE}">{for_html(infer.text)}</pre>'
        blocks.append(head + body)
    return "".join(blocks)


def coverage_bar(f: FileState, width: int = 240) -> str:
    """An inline SVG bar: grey is the file, blue the byte ranges read."""
    rects = []
    if f.length > 0:
        # One rect per run of covered pixels, however many ranges were read.
        spans: list[list[int]] = []
        for a, b in f.ranges:
            x0, x1 = int(width * a / f.length), max(int(width * a / f.length) + 1, int(width * b / f.length + 0.999))
            if spans and x0 <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], x1)
            else:
                spans.append([x0, x1])
        rects = [f'<rect x="{x0}" y="0" width="{x1 - x0}" height="10" fill="{BLUE}"/>' for x0, x1 in spans]
    pct = 100.0 * f.bytes_covered / f.length if f.length else 100.0
    about = "≈" if f.approximate else ""
    return (f'<svg class="tj-coverage" data-covered="{pct:.1f}" width="{width}" height="10" '
            f'style="vertical-align:middle"><rect width="{width}" height="10" fill="{LIGHT_GREY}"/>'
            f'{"".join(rects)}</svg> <span style="font-size:11px">{about}{pct:.0f}% read</span>')


def hex_dump(data: bytes, offset: int = 0) -> str:
    lines = []
    for i in range(0, min(len(data), MAX_HEX_BYTES), 16):
        row = data[i:i + 16]
        hexes = " ".join(f"{b:02x}" for b in row)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append(f"{offset + i:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def files(state: ViewState) -> str:
    if not state.files:
        return ""
    rows = []
    thumbs = {f.handle for f in list(state.files.values()) if f.thumbnail}
    thumbs = set(sorted(thumbs)[-MAX_THUMBNAILS:])
    for f in state.files.values():
        if f.preview_bytes is not None:
            preview = hex_dump(f.preview_bytes, f.preview_offset)
        else:
            preview = f.preview or ""
        if f.pages is not None or f.thumbnail is not None or f.size_px is not None:
            rows.append(document_row(f, f.handle in thumbs))
            continue
        rows.append(
            f'<div class="tj-file" style="margin:4px 0;font-family:sans-serif;font-size:12px">'
            f'<b>#{f.handle}</b> <code>{for_html(f.path)}</code> · {human_bytes(f.length)} · {for_html(f.kind)}<br>'
            f'{coverage_bar(f)}'
            f'<pre class="tj-preview" style="{PRE}max-height:8em;overflow:auto;background:{PALE};padding:2px">'
            f'{for_html(preview)}</pre></div>')
    return ("<div style='line-height:1.4'><b style='font-family:sans-serif;font-size:12px'>Files</b>"
            + "".join(rows) + "</div>")


#: Thumbnails shown at once (the latest images): every update resends the panel.
MAX_THUMBNAILS = 6


def page_bar(f: FileState, width: int = 240) -> str:
    """An inline SVG bar of a document's pages: blue where pages were read (text or image)."""
    pages = f.pages or 0
    read = range(pages) if f.all_pages_read else sorted(p for p in f.pages_read if 0 <= p < pages)
    spans: list[list[int]] = []
    for p in read:  # one rect per run of covered pixels, however many pages
        x0, x1 = int(width * p / pages), max(int(width * p / pages) + 1, int(width * (p + 1) / pages))
        if spans and x0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], x1)
        else:
            spans.append([x0, x1])
    gap = 1 if pages and width / pages > 3 else 0  # separate the cells of a short document
    rects = "".join(f'<rect x="{a}" y="0" width="{max(1, b - a - gap)}" height="10" fill="#1f6feb"/>' for a, b in spans)
    return (f'<svg class="tj-pages" data-pages-read="{len(read)}" width="{width}" height="10" '
            f'style="vertical-align:middle"><rect width="{width}" height="10" fill="#d0d7de"/>{rects}</svg>'
            f' <span style="font-size:11px">{len(read)} of {pages} pages read</span>')


def thumbnail(data: bytes | None, alt: str) -> str:
    """A PNG the host made, as an <img> data URI: the bytes re-encoded here, so nothing but base64 reaches the tag."""
    if not data or not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return ""
    b64 = base64.b64encode(data).decode("ascii")
    return (f'<img class="tj-thumb" alt="{for_html(alt)}" src="data:image/png;base64,{b64}" '
            f'style="max-width:160px;max-height:160px;border:1px solid #d0d7de;display:block;margin:2px 0"/>')


def document_row(f: FileState, show_thumbnail: bool = True) -> str:
    """A Files-panel row for a document (pages read, latest page text) or a host-made image (thumbnail)."""
    head = (f'<b>#{f.handle}</b> <code>{for_html(f.path)}</code> · {human_bytes(f.length)} · {for_html(f.kind)}')
    if f.size_px is not None:
        head += f" · {f.size_px[0]}×{f.size_px[1]} px"
    body = ""
    if f.pages is not None:
        body += page_bar(f)
        if f.page_text is not None:
            label = "all pages" if f.page_no is None else f"page {f.page_no}"
            colour = "#cf222e" if f.page_error else "inherit"
            body += (f'<div style="font-size:11px;color:#57606a">{label}</div>'
                     f'<pre class="tj-page-text" style="{PRE}max-height:8em;overflow:auto;background:#f6f8fa;'
                     f'padding:2px;color:{colour}">{for_html(f.page_text)}</pre>')
    if show_thumbnail:
        body += thumbnail(f.thumbnail, f.path)
    if f.ranges:
        body += coverage_bar(f)
    return (f'<div class="tj-file tj-document" style="margin:4px 0;font-family:sans-serif;font-size:12px">'
            f'{head}<br>{body}</div>')


def output(state: ViewState) -> str:
    if not state.chunks:
        return ""
    return (f'<div style="font-family:sans-serif;font-size:11px;color:{GREY}">output · {state.chunks} chunks · '
            f'{human_bytes(state.output_bytes)}</div><pre class="tj-output" style="{PRE}">'
            f'{for_html(state.output_text)}</pre>')


def json_tree(value: Any, key: str | None = None, depth: int = 0, budget: list[int] | None = None) -> str:
    """Collapsible JSON: objects and arrays are <details>, open near the top.

    Bounded whatever the value: at most ``TREE_MAX_DEPTH`` levels (deeper
    values are shown as clipped compact JSON), ``TREE_MAX_CHILDREN`` children
    a level and ``TREE_MAX_NODES`` nodes in all; each scalar is clipped.
    """
    budget = budget if budget is not None else [TREE_MAX_NODES]
    budget[0] -= 1
    label = f"<b>{for_html(clip(key, TREE_MAX_CHARS))}</b>: " if key is not None else ""
    margin = f"margin-left:{12 if depth else 0}px"
    if isinstance(value, (dict, list)) and value and depth < TREE_MAX_DEPTH and budget[0] > 0:
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        inner = []
        for k, v in items[:TREE_MAX_CHILDREN]:
            if budget[0] <= 0:
                break
            inner.append(json_tree(v, str(k), depth + 1, budget))
        if len(inner) < len(items):
            inner.append(f'<div style="margin-left:12px;color:{GREY}">… {len(items) - len(inner)} more</div>')
        what = f"{{…}} {len(value)} keys" if isinstance(value, dict) else f"[…] {len(value)} items"
        return (f'<details{" open" if depth < 2 else ""} style="{margin}">'
                f'<summary>{label}{what}</summary>{"".join(inner)}</details>')
    text = clip(json.dumps(value, ensure_ascii=False, separators=(",", ":")), TREE_MAX_CHARS)
    return f'<div style="{margin}">{label}<code>{for_html(text)}</code></div>'


def result(state: ViewState) -> str:
    if state.error:
        code, message = str(state.error.get("code")), str(state.error.get("message"))
        text = for_html(message) if error_text(code, message) == message else \
            f'<b>{for_html(code)}</b>: {for_html(message)}'
        return f'<div class="tj-error" style="color:{RED};font-family:sans-serif">{text}</div>'

    if not state.has_result:
        return ""
    return (f'<div class="tj-result" style="font-family:monospace;font-size:12px;line-height:1.4">'
            f'<b style="font-family:sans-serif">Result</b>{json_tree(state.result)}</div>')


def usage(state: ViewState) -> str:
    """Tokens, time and model -- or only the time, for a job that never asked the model anything."""
    if not state.usage or not isinstance(state.usage, dict):
        return ""
    # A shown transcript's usage is a file's word: every value escaped, whatever it holds.
    u = {k: for_html("" if v is None else str(v)) for k, v in state.usage.items()}
    model = (f'{u.get("tokens_in")} tokens in · {u.get("tokens_out")} out · {u.get("duration_ms")} ms · '
             f'model {u.get("model") or "none"}') if state.usage.get("tokens_in") or state.usage.get("tokens_out") \
        else f'{u.get("duration_ms")} ms · no model used'
    return f'<div class="tj-usage" style="font-family:sans-serif;font-size:11px;color:{GREY}">{model}</div>'


def progress(state: ViewState, width: int = 240) -> str:
    """The progress bar as plain markup (for the static view); nothing when the guest reported no progress."""
    if state.fraction is None:
        return ""
    colour = {"completed": GREEN, "failed": RED}.get(state.status, BLUE)
    return (f'<div class="tj-progress" style="font-family:sans-serif;font-size:12px">'
            f'<span style="display:inline-block;vertical-align:middle;width:{width}px;height:10px;'
            f'background:{LIGHT_GREY}"><span style="display:block;height:10px;width:{100 * state.fraction:.1f}%;'
            f'background:{colour}"></span></span> {for_html(state.progress_text)}</div>')


#: The sections of the static view, in the live view's order.
STATIC_SECTIONS = ("header", "progress", "debug", "log", "tokens", "files", "output", "result", "usage")


def static(state: ViewState) -> str:
    """The whole view as one piece of inert HTML: what a notebook keeps for readers without the widget's
    JavaScript (nbconvert's HTML, GitHub, nbviewer). The same renderers, so the same escaping."""
    sections = "".join(RENDERERS[name](state) for name in STATIC_SECTIONS)
    return (f'<div class="tensorjob-view tj-static" style="border:1px solid {LIGHT_GREY};padding:4px">'
            f'{sections}</div>')


#: Why a job paused, as the debug panel says it.
PAUSE_REASONS = {"start": "started paused (--debug)", "pause": "Pause", "step": "Step", "until": "step to",
                 "break": "breakpoint", "failure": "before the failure is final (--break-on fail)"}


def debug(state: ViewState) -> str:
    """The debugger's panel: where the job is paused and why, the command about to be carried out, the last
    command and the event that answered it, open handles, guest memory."""
    if not state.debugging:
        return ""
    d = state.debug
    box = f'<div class="tj-debug" style="font-family:sans-serif;font-size:12px;border-left:3px solid {PURPLE};' \
          f'padding-left:6px;margin:4px 0">'
    if d is None:
        what = "ended before it paused" if state.done else "running (paused at the next command when asked)"
        return f'{box}<b>debugger</b> <span class="tj-debug-where">{what}</span></div>'
    step = d["step"]
    command = d["command"] if isinstance(d["command"], dict) else {}
    cmd = command.get("cmd")
    if step == 0 and d["reason"] != "failure":
        where = "before cf_init"
    else:
        where = f"before step {step}" if step is not None else "at a step"
        if isinstance(cmd, str):
            where += f" (<code>{for_html(cmd)}</code>)"
    why = for_html(PAUSE_REASONS.get(d["reason"], d["reason"]))
    if d["reason"] == "until" and d["until"]:
        why += f" <code>{for_html(d['until'])}</code>"
    elif d["reason"] == "break" and isinstance(cmd, str):
        why += f" on <code>{for_html(cmd)}</code>"
    if state.paused and not state.done:
        head = f'<b>paused</b> {where} · {why}'
    else:
        head = f'<b>{"ended" if state.done else "running"}</b> · last paused {where} · {why}'
    parts = [f'{box}<div class="tj-debug-where">{head}</div>']
    if d["error"]:
        parts.append(f'<div class="tj-debug-error" style="color:{RED}"><b>{for_html(d["error"]["code"])}</b>: '
                     f'{for_html(d["error"]["message"])}</div>')
    tree = 'style="font-family:monospace;font-size:12px;line-height:1.4"'
    if d["command"] is not None:
        parts.append(f'<div class="tj-debug-command" {tree}><b style="font-family:sans-serif">next command</b> '
                     f'<span style="color:{GREY}">(returned by the guest, not yet carried out)</span>'
                     f'{json_tree(d["command"])}</div>')
    if d["last_command"] is not None:
        parts.append(f'<div class="tj-debug-last" {tree}><b style="font-family:sans-serif">last command</b>'
                     f'{json_tree(d["last_command"])}</div>')
    if d["last_event"] is not None:
        parts.append(f'<div class="tj-debug-event" {tree}><b style="font-family:sans-serif">answered by</b>'
                     f'{json_tree(d["last_event"])}</div>')
    bits = []
    if d["step"] is not None:
        bits.append(f'<span class="tj-debug-step">step {d["step"]}</span>')
    if d["memory_bytes"] is not None:
        peak = f" (peak {human_bytes(d['peak_memory_bytes'])})" if d["peak_memory_bytes"] is not None else ""
        bits.append(f'guest memory {human_bytes(d["memory_bytes"])}{peak}')
    open_count = d["open_handles"] if d["open_handles"] is not None else len(d["handles"])
    handles = ", ".join(f'#{h} <code>{for_html(path)}</code> ({human_bytes(n)}, {for_html(kind)})'
                        for h, path, n, kind in d["handles"])
    more = open_count - len(d["handles"])
    handles += f" … {more} more" if more > 0 else ""
    bits.append(f'<span class="tj-debug-handles">{open_count} open handle{"" if open_count == 1 else "s"}'
                f'{": " + handles if handles else ""}</span>')
    parts.append(f'<div style="color:{GREY};font-size:11px">{" · ".join(bits)}</div></div>')
    return "".join(parts)


RENDERERS = {"header": header, "progress": progress, "log": log, "tokens": tokens, "files": files,
             "output": output, "result": result, "usage": usage, "debug": debug}


__all__ = [
    "BLUE", "GREEN", "RED", "AMBER", "GREY", "LIGHT_GREY", "PALE", "PURPLE", "STATUS_COLOURS", "PRE", "MAX_HEX_BYTES",
    "TREE_MAX_DEPTH", "TREE_MAX_CHILDREN", "TREE_MAX_NODES", "TREE_MAX_CHARS", "human_bytes", "status_badge",
    "header", "tokens", "coverage_bar", "hex_dump", "files", "MAX_THUMBNAILS", "page_bar", "thumbnail",
    "document_row", "output", "json_tree", "result", "usage", "progress", "STATIC_SECTIONS", "static",
    "PAUSE_REASONS", "debug", "RENDERERS"
]
