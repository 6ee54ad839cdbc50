"""Every bound a job runs under, in one place, each with a sensible default.

A guest is hostile until proven otherwise, so nothing it can ask for is unbounded. ``Limits`` is a frozen value
(derive variants with ``limits.replace(...)``) and the one table the entry points are built from: each field's
metadata gives its help text and unit, and ``frontends/options.py`` makes every field a flag, a traitlet and a
keyword, so no limit is described twice.

Design: docs/internals/host.md#limitspy
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

KiB = 1024
MiB = 1024 * KiB

SECONDS, BYTES, COUNT = "seconds", "bytes", "count"
#: Limits that may be None: no job deadline, no fuel metering.
OPTIONAL = frozenset({"job_timeout_s", "fuel"})


def _limit(default, unit: str, help: str, *, flag: str | None = None):
    return field(default=default, metadata={"unit": unit, "help": help, "flag": flag})


@dataclass(frozen=True)
class Limits:
    call_timeout_s: float = _limit(10.0, SECONDS, "wall-clock deadline of each call into the guest "
                                   "(cf_init, cf_step, cf_on_token, cf_alloc); past it: timeout",
                                   flag="--call-timeout")
    job_timeout_s: float | None = _limit(600.0, SECONDS, "wall-clock budget of the whole job, inference "
                                         "included; past it: timeout", flag="--timeout")
    fuel: int | None = _limit(None, COUNT, "instruction budget of the whole job (wasmtime fuel); "
                              "off unless set; exhausted: timeout")
    memory_bytes: int = _limit(256 * MiB, BYTES, "the most linear memory the guest may have; "
                               "memory.grow past it returns -1")
    stack_bytes: int = _limit(1 * MiB, BYTES, "native stack for wasm frames; deeper recursion traps")
    max_steps: int = _limit(1_000_000, COUNT, "commands the guest may return before the job fails")
    max_emit_bytes: int = _limit(64 * KiB, BYTES, "largest emit payload, as compact JSON")
    max_window_bytes: int = _limit(4 * MiB, BYTES, "largest window one slice returns; larger asks get less")
    max_handles: int = _limit(64, COUNT, "files a job may hold open at once")
    max_handle_bytes: int = _limit(256 * MiB, BYTES, "bytes the job's handles may hold together in memory: "
                                   "fetched bodies, rendered pages and image_op results (opened files stay on "
                                   "disk and do not count); past it: limit_exceeded")
    max_tokens: int = _limit(32_768, COUNT, "tokens the whole job may generate; each infer is clamped to "
                             "what is left")
    max_command_bytes: int = _limit(16 * MiB, BYTES, "largest JSON command a guest may return")
    max_command_values: int = _limit(1_000_000, COUNT, "JSON values (array elements, object members) in one "
                                     "command, counted on its bytes before it is parsed")
    max_result_bytes: int = _limit(1 * MiB, BYTES, "largest done result, as compact JSON (a finished job "
                                   "keeps its result; stream big output with emit-chunk)")
    max_event_bytes: int = _limit(256 * MiB, BYTES, "everything the job may publish (its transcript, as JSON)")
    max_embed_texts: int = _limit(256, COUNT, "texts in one embed command")
    max_embed_bytes: int = _limit(1 * MiB, BYTES, "UTF-8 bytes of the texts of one embed command")
    max_chunk_bytes: int = _limit(64 * KiB, BYTES, "largest single emit-chunk of streamed output")
    max_stream_bytes: int = _limit(64 * MiB, BYTES, "streamed output of the whole job; emit-chunk past it "
                                   "returns -2")
    max_document_pages: int = _limit(10_000, COUNT, "pages a document may have; a PDF with more is refused at "
                                     "open")
    max_text_bytes: int = _limit(4 * MiB, BYTES, "largest text one page_text / document_text answer carries "
                                 "(page_text_opt answers an error)")
    max_render_pixels: int = _limit(16 * MiB, COUNT, "largest page page_image renders, in "
                                    "pixels (pages are rendered 1024 wide), computed before anything is drawn")
    max_image_pixels: int = _limit(64 * MiB, COUNT, "largest image image_op decodes, in pixels, read from the "
                                   "image's header first: a decompression bomb is refused unread")
    document_timeout_s: float = _limit(30.0, SECONDS, "wall clock of each call into the document engine (the "
                                       "separate process running pdfium and Pillow); past it the engine is "
                                       "killed: timeout")
    document_memory_bytes: int = _limit(2048 * MiB, BYTES, "address space of the document engine process "
                                        "(RLIMIT_AS)")
    document_cpu_s: float = _limit(600.0, SECONDS, "CPU time the document engine process may use over the whole "
                                   "job (RLIMIT_CPU, whole seconds, rounded up); it also bounds an engine whose "
                                   "host died without killing it; past it: limit_exceeded")
    max_fetch_bytes: int = _limit(64 * MiB, BYTES, "largest body one fetch downloads (after any gzip decoding)")
    fetch_timeout_s: float = _limit(60.0, SECONDS, "wall clock of one fetch, redirects included: timeout")
    max_fetch_redirects: int = _limit(5, COUNT, "redirects one fetch follows, each checked against the grants "
                                      "again")
    max_paused_s: float = _limit(600.0, SECONDS, "longest one debugger pause may last (--debug, --break-on); "
                                 "paused time does not count against job_timeout_s; past it: paused_too_long "
                                 "(the job is cancelled)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            try:
                check(f.name, getattr(self, f.name))
            except ValueError as e:
                raise ValueError(f"limit {f.name} {e}") from None

    def replace(self, **changes) -> "Limits":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in _NAMES}  # every limit is a number or None: no deep copy


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Limits)}
_NAMES = tuple(FIELDS)


def reference_table() -> str:
    """Every limit as a Markdown table: ``Limits``' docstring (``tj.Limits?`` in a notebook) and the API
    reference page (``tools/docs_hooks.py``) show this one table."""
    rows = ["| limit | default | unit | what it bounds |", "|---|---|---|---|"]
    for f in FIELDS.values():
        default = "off" if f.default is None else f"{f.default:,}"
        rows.append(f"| `{f.name}` | {default} | {f.metadata['unit']} | {f.metadata['help']} |")
    return "\n".join(rows)


# The class's docstring is made from the table, so what a notebook shows cannot drift from the fields.
Limits.__doc__ = ("Every bound a job runs under, each with its default: a frozen value "
                  "(``Limits(max_tokens=64)``, ``limits.replace(...)``); each is also a keyword of ``Job``, "
                  "``tj.run`` and ``tj.map``, and a flag of the magics and the command line.\n\n"
                  + reference_table())


def check(name: str, value) -> None:
    """Raise ``ValueError`` if ``value`` is not a valid ``name`` limit (the message
    says what is wrong, not where it came from: callers name their own flag)."""
    if name not in FIELDS:
        raise ValueError(f"there is no limit called {name!r}")
    if value is None and name in OPTIONAL:
        return
    unit = FIELDS[name].metadata["unit"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"must be a positive number, got {value!r}")
    if unit != SECONDS and not float(value).is_integer():
        raise ValueError(f"must be a whole number, got {value!r}")


def with_keywords(limits: Limits | None, keywords: Mapping[str, Any], where: str) -> Limits:
    """``limits`` with limit keywords applied (``max_tokens=...``); unknown keywords are a ``TypeError``
    naming ``where`` (the function the keywords were given to)."""
    unknown = sorted(set(keywords) - set(FIELDS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {', '.join(unknown)}; limits are "
                        f"{', '.join(FIELDS)}")
    return (limits or Limits()).replace(**keywords)


__all__ = ["KiB", "MiB", "OPTIONAL", "Limits", "FIELDS", "reference_table", "check", "with_keywords"]
