"""A run's sources as ``tensorjob show --sources`` prints them: each field, its place, an excerpt of the file.

A source names a file and byte offsets (``host/grounding.py``); the excerpt reads those bytes again
(``host/excerpts.py``: bounded, from a regular file only, decoded with replacement), and here it is made
terminal-safe; a page's text or a fetched body (which the host does not keep) gives no excerpt.
"""

from __future__ import annotations

from tensorjob_jupyter.host.excerpts import CONTEXT_BYTES, SPAN_BYTES, excerpt_parts
from tensorjob_jupyter.host.fields import result_fields
from tensorjob_jupyter.host.grounding import DOUBTFUL, ELSEWHERE, GROUNDED, evidence_kind, source_label
from tensorjob_jupyter.record.event_checks import check_sources
from tensorjob_jupyter.text import clip, for_terminal, json_text


def source_excerpt(source: dict, *, width: int = 100) -> str | None:
    """``…before«span»after…`` around ``source`` in its file (one terminal-safe line of about ``width``
    characters); None where there is no file to read (a URL, a page's text), or it cannot be read now."""
    parts = excerpt_parts(source)
    if parts is None:
        return None
    before, span, after, cut_before = parts
    shown = [for_terminal(part, one_line=True) for part in (before, span, after)]
    room = max(10, width - len(shown[1]) - 4) // 2
    return ("…" if cut_before else "") + shown[0][-room:] + "«" + shown[1] + "»" + shown[2][:room] + "…"


#: How the terminal says what a field's sources say of it, where that is not "found".
KIND_WORDS = {ELSEWHERE: "found elsewhere: only under a label that names another field",
              DOUBTFUL: "doubtful: only a fuzzy match or an ambiguous spelling, not the value itself"}


def sources_text(envelope: dict | None, *, width: int = 100) -> str:
    """``show --sources``: each field of a run's result with where it was found and a clipped excerpt around
    the span (read again from the file; a fetched body is not kept, so a URL's field shows its offsets only),
    or ``not found``; terminal-safe."""
    if not isinstance(envelope, dict) or envelope.get("status") != "completed":
        return "sources: the run did not complete; it has no result to locate"
    sources = envelope.get("sources")
    if not isinstance(sources, dict) or check_sources(sources) is not None:
        return "sources: none recorded for this run"
    if not sources:
        return "sources: the result has no field to locate"
    values = dict(result_fields(envelope.get("result")))
    lines = ["sources:"]
    for name, found in sources.items():
        shown = for_terminal(name or "(the result)", one_line=True)
        value = for_terminal(clip(json_text(values.get(name), pretty=False), 60), one_line=True)
        if not found:
            lines.append(f"  {shown} = {value}: not found in what the job read")
            continue
        best = found[0]
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        kind = evidence_kind(found)
        said = "" if kind == GROUNDED else f" -- {KIND_WORDS[kind]}" if kind in KIND_WORDS else ""
        label = best.get("label")
        under = f" under «{for_terminal(clip(label, 40), one_line=True)}»" if isinstance(label, str) and label else ""
        lines.append(f"  {shown} = {value}: {for_terminal(source_label(best), one_line=True)} "
                     f"{best['match']} {best['score']:g}{more}{under}{said}")
        excerpt = source_excerpt(best, width=max(40, width - 6))
        if excerpt is not None:
            lines.append(f"      {excerpt}")
    return "\n".join(lines)


__all__ = ["CONTEXT_BYTES", "SPAN_BYTES", "excerpt_parts", "source_excerpt", "sources_text"]
