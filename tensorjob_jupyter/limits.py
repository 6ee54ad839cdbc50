"""Every bound a job runs under, in one place, each with a sensible default.

A guest is hostile until proven otherwise, so nothing it can ask for is
unbounded: the time of each call into it and of the whole job, its CPU work
(optional fuel), its linear memory and native stack, the number of steps and
open handles, the size of an ``emit`` payload and of a ``slice`` window, its
streamed output, the tokens the job may generate, and the document, image
and fetch work done for it (pages, text, pixels, time, bytes). ``Limits`` is a frozen
value; derive variants with ``limits.replace(...)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Limits:
    #: Wall-clock deadline for each call into the guest (cf_init, cf_step,
    #: cf_on_token, cf_alloc). A guest spinning past it ends with ``timeout``.
    call_timeout_s: float = 10.0
    #: Wall-clock budget for the whole job, inference included.
    job_timeout_s: float | None = 600.0
    #: Optional instruction budget for the whole job (wasmtime fuel units);
    #: ``None`` disables fuel metering. Exhausting it is ``timeout``.
    fuel: int | None = None
    #: The most linear memory the guest may have; ``memory.grow`` past it fails.
    memory_bytes: int = 256 * MiB
    #: Native stack for wasm frames; deeper recursion traps (``wasm_trap``).
    stack_bytes: int = 1 * MiB
    #: Commands the guest may return before the job fails with ``limit_exceeded``.
    max_steps: int = 1_000_000
    #: Largest ``emit`` payload, in bytes of compact JSON.
    max_emit_bytes: int = 64 * KiB
    #: Largest window one ``slice``/``slice_bytes`` returns; larger asks get less.
    max_window_bytes: int = 4 * MiB
    #: Files a job may hold open at once.
    max_handles: int = 64
    #: Tokens the whole job may generate; each infer's max_tokens is clamped.
    max_tokens: int = 32_768
    #: Largest JSON command a guest may return.
    max_command_bytes: int = 16 * MiB
    #: Total bytes of events a job may publish (its transcript, as JSON):
    #: bounds the host's memory and disk whatever the guest emits or streams.
    max_event_bytes: int = 256 * MiB
    #: Texts in one ``embed`` command, and their total UTF-8 bytes.
    max_embed_texts: int = 256
    max_embed_bytes: int = 1 * MiB
    #: Largest single ``emit-chunk`` (wasi:tensor streaming output).
    max_chunk_bytes: int = 64 * KiB
    #: Total streamed output per job; ``emit-chunk`` past it returns -2.
    max_stream_bytes: int = 64 * MiB
    #: Pages a document may have: ``open`` or ``fetch`` of a longer PDF fails
    #: with ``limit_exceeded`` (pdfium's own page count, not the file's claim).
    max_document_pages: int = 10_000
    #: Largest text one ``page_text`` / ``document_text`` answer carries, in
    #: UTF-8 bytes (``limit_exceeded``; ``page_text_opt`` answers an error).
    max_text_bytes: int = 4 * MiB
    #: Largest page ``page_image`` renders, in pixels (pages are rendered 1024
    #: wide), computed from the page size before anything is drawn.
    max_render_pixels: int = 16 * MiB
    #: Largest image ``image_op`` decodes, in pixels, read from the image's
    #: header before decoding: a decompression bomb is refused unread.
    max_image_pixels: int = 64 * MiB
    #: Wall clock of each call into the document engine (the separate process
    #: running pdfium and Pillow); past it the engine is killed: ``timeout``.
    document_timeout_s: float = 30.0
    #: Address space of the document engine process (``RLIMIT_AS``).
    document_memory_bytes: int = 2048 * MiB
    #: Largest body one ``fetch`` downloads (after any gzip decoding).
    max_fetch_bytes: int = 64 * MiB
    #: Wall clock of one ``fetch``, redirects included: ``timeout``.
    fetch_timeout_s: float = 60.0
    #: Redirects one ``fetch`` follows, each checked against the grants again.
    max_fetch_redirects: int = 5

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("job_timeout_s", "fuel"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"limit {f.name} must be a positive number, got {value!r}")

    def replace(self, **changes) -> "Limits":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
