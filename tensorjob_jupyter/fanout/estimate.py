"""What a map will cost before it runs: prompt tokens per item, and the time this machine needs for them.

    estimate = tj.estimate_map("extract.py", "reports.jsonl", read=["reports"])   # tensorjob map --estimate

Nothing is decoded: for a sample of the items the guest runs up to its first infer, whose request is counted by
the model's tokenizer (or as four characters a token for a served model) and then stopped. The shared prompt
prefix is counted apart, and the time comes from this machine's own recorded infers of the same model.

Design: docs/internals/fanout.md#estimatepy
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from tensorjob_jupyter.abi import JobStatus
from tensorjob_jupyter.host.jobs import Job
from tensorjob_jupyter.inference.base import GenerateRequest, ModelError
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.record.job_folder import runs_folder
from tensorjob_jupyter.record.transcript import EventReader
from tensorjob_jupyter.fanout.map_folder import JOBS
from tensorjob_jupyter.fanout.manifest import Manifest, read_manifest
from tensorjob_jupyter.fanout.map_spec import MapSpec
from tensorjob_jupyter.fanout.start import item_spec, map_job, process_backend

#: Items whose first infer an estimate runs to, at most (spread over the manifest).
DEFAULT_SAMPLE = 20
#: Characters a token is counted as where the model has no tokenizer here (a served model).
CHARS_PER_TOKEN = 4
#: Recorded transcripts and infers read for the speed, newest first, at most.
SPEED_RUNS = 200
SPEED_INFERS = 400
#: A recorded infer counts as measured on a quiet machine when the 1-min load average a CPU was below this as it
#: ended (its response's ``timing.load_per_core``); the speed is taken from quiet infers when there are enough.
QUIET_LOAD_PER_CPU = 0.75
MIN_QUIET_INFERS = 3
#: How long one item's run to its first infer may take (a guest that opens and slices a large document first is
#: well inside it), and how many such runs may time out before the estimate stops sampling: a guest that never
#: reaches an infer costs the estimate about a minute, not one limit per sampled item.
DRY_RUN_TIMEOUT_S = 30.0
MAX_DRY_RUN_TIMEOUTS = 2
#: How long a model's tokenizer may take to count one request.
COUNT_TIMEOUT_S = 120.0
#: The error a dry run's stand-in model gives at the first infer.
STOPPED_HERE = "stopped at the first infer: an estimate decodes nothing"


class _FirstInfer:
    """A backend that keeps the first request it is sent and answers none (the job stops there)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.request: GenerateRequest | None = None

    def generate_stream(self, request, on_token) -> Future:
        self.request = self.request or request
        future: Future = Future()
        future.set_exception(ModelError(STOPPED_HERE))
        return future

    def embed(self, texts) -> Future:
        future: Future = Future()
        future.set_exception(ModelError(STOPPED_HERE))
        return future


@dataclass(frozen=True)
class Speed:
    """This machine's measured speed for one model: prompt and generated tokens per second, typical (the
    median of the infers it was measured from) and fast (their upper quartile), and where it came from."""

    prompt_tokens_per_s: float
    output_tokens_per_s: float
    infers: int  # recorded infers it was measured from
    fast_prompt_tokens_per_s: float = 0.0
    fast_output_tokens_per_s: float = 0.0
    #: Of ``infers``, how many ran on a quiet machine (``QUIET_LOAD_PER_CPU``); the speed is theirs alone when
    #: there are at least ``MIN_QUIET_INFERS``, else every infer's (and ``busy`` says the machine was not quiet).
    quiet: int = 0
    busy: bool = False

    def to_json(self) -> dict:
        return {"prompt_tokens_per_s": round(self.prompt_tokens_per_s, 1),
                "output_tokens_per_s": round(self.output_tokens_per_s, 1), "infers": self.infers,
                "fast_prompt_tokens_per_s": round(self.fast_prompt_tokens_per_s, 1),
                "fast_output_tokens_per_s": round(self.fast_output_tokens_per_s, 1),
                "quiet": self.quiet, "busy": self.busy}

    def source(self) -> str:
        """Where the speed came from, in words."""
        if not self.busy:
            return (f"measured from {self.infers} recorded infers on this machine while it was quiet (1-min load "
                    f"under {QUIET_LOAD_PER_CPU:g} a CPU)")
        return (f"measured from {self.infers} recorded infers on this machine, fewer than {MIN_QUIET_INFERS} of "
                f"them while it was quiet: on a quiet machine it will be faster")


@dataclass(frozen=True)
class ItemEstimate:
    item: int
    prompt_tokens: int | None  # None: the item never reached an infer
    max_tokens: int | None
    error: str | None = None  # why it never reached one (its job's error)


@dataclass(frozen=True)
class MapEstimate:
    """What a map will cost (see the module doc); ``lines()`` says it, ``to_json()`` gives it as data."""

    items: int
    model: str
    counted_by: str  # "tokenizer" or "characters"
    sampled: list[ItemEstimate]
    shared_prefix_tokens: int
    speed: Speed | None
    #: Items picked for the sample but not run: sampling stopped once ``MAX_DRY_RUN_TIMEOUTS`` runs timed out.
    unsampled: int = 0

    @property
    def reached(self) -> list[ItemEstimate]:
        return [e for e in self.sampled if e.prompt_tokens is not None]

    @property
    def reached_prompt_tokens(self) -> list[int]:
        """The prompt tokens of each sampled item that reached an infer (``reached``'s, in its order)."""
        return [e.prompt_tokens for e in self.sampled if e.prompt_tokens is not None]

    @property
    def prompt_tokens_per_item(self) -> float | None:
        reached = self.reached_prompt_tokens
        return statistics.fmean(reached) if reached else None

    @property
    def prompts(self) -> int:
        """The items expected to reach an infer: the sampled ones that did, and every one not sampled."""
        return len(self.reached) + self.items - len(self.sampled)

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt tokens of every item's first infer (the sample's mean for those not sampled)."""
        mean = self.prompt_tokens_per_item
        if mean is None:
            return None
        return round(sum(self.reached_prompt_tokens) + mean * (self.items - len(self.sampled)))

    @property
    def decoded_prompt_tokens(self) -> int | None:
        """The prompt tokens decoded when the shared prefix is decoded once and reused."""
        total = self.prompt_tokens
        if total is None:
            return None
        return max(0, total - self.shared_prefix_tokens * (self.prompts - 1))

    @property
    def output_tokens(self) -> int | None:
        """At most this many generated tokens: each item's first infer's ``max_tokens``."""
        reached = [e.max_tokens for e in self.reached if e.max_tokens is not None]
        if not reached:
            return None
        return round(sum(reached) + statistics.fmean(reached) * (self.items - len(self.sampled)))

    @property
    def seconds(self) -> float | None:
        """The expected time, one item at a time, at most, at the typical measured speed (None without one)."""
        if self.speed is None or self.decoded_prompt_tokens is None:
            return None
        return self._seconds(self.speed.prompt_tokens_per_s, self.speed.output_tokens_per_s)

    @property
    def fast_seconds(self) -> float | None:
        """The same at the fast measured speed: the low end of the range (None without a speed)."""
        if self.speed is None or self.decoded_prompt_tokens is None:
            return None
        s = self.speed
        return self._seconds(s.fast_prompt_tokens_per_s or s.prompt_tokens_per_s,
                             s.fast_output_tokens_per_s or s.output_tokens_per_s)

    def _seconds(self, prompt_rate: float, output_rate: float) -> float:
        return (self.decoded_prompt_tokens or 0) / prompt_rate + (self.output_tokens or 0) / output_rate

    def lines(self) -> list[str]:
        counted = ("counted by the model's tokenizer" if self.counted_by == "tokenizer"
                   else f"counted as {CHARS_PER_TOKEN} characters a token (the model has no tokenizer here)")
        out = [f"estimate for {self.items} items on {self.model} (nothing decoded; {len(self.sampled)} item(s) "
               f"run to their first infer)"]
        mean = self.prompt_tokens_per_item
        if mean is None:
            out.append("no sampled item reached an infer: nothing to count")
        else:
            sizes = self.reached_prompt_tokens
            out.append(f"prompt tokens per item: {mean:.0f} (from {min(sizes)} to {max(sizes)}; {counted})")
            out.append(f"prompt tokens in all: {self.prompt_tokens}; decoded with the shared prefix of "
                       f"{self.shared_prefix_tokens} tokens decoded once: {self.decoded_prompt_tokens}")
            if self.output_tokens is not None:
                out.append(f"generated tokens: at most {self.output_tokens} (each first infer's max_tokens)")
        if self.speed is None:
            out.append("time: not estimated -- no infers of this model are recorded on this machine yet; run a "
                       "few items first (--max-total-tokens N bounds what they spend)")
        elif self.seconds is not None:
            s = self.speed
            low, high = _duration(self.fast_seconds or self.seconds), _duration(self.seconds)
            span = f"about {high}" if low == high else f"from about {low} to {high}"
            out.append(f"time: {span} one item at a time, at most (a map decodes items together, and answers "
                       f"shorter than max_tokens take less), at {s.prompt_tokens_per_s:.0f} prompt and "
                       f"{s.output_tokens_per_s:.1f} generated tokens/s typical, "
                       f"{s.fast_prompt_tokens_per_s:.0f} and {s.fast_output_tokens_per_s:.1f} fast ({s.source()})")
        failed = [e for e in self.sampled if e.prompt_tokens is None]
        for e in failed[:5]:
            out.append(f"item {e.item} never reaches an infer: {e.error}")
        if len(failed) > 5:
            out.append(f"... and {len(failed) - 5} more sampled items never reach one")
        if self.unsampled:
            out.append(f"sampling stopped after {MAX_DRY_RUN_TIMEOUTS} items timed out: {self.unsampled} more "
                       f"picked for the sample were not run")
        return out

    def to_json(self) -> dict:
        return {"items": self.items, "model": self.model, "counted_by": self.counted_by,
                "sampled": len(self.sampled), "unsampled": self.unsampled,
                "prompt_tokens_per_item": self.prompt_tokens_per_item,
                "prompt_tokens": self.prompt_tokens, "shared_prefix_tokens": self.shared_prefix_tokens,
                "decoded_prompt_tokens": self.decoded_prompt_tokens, "output_tokens": self.output_tokens,
                "speed": self.speed.to_json() if self.speed else None,
                "seconds": None if self.seconds is None else round(self.seconds, 1),
                "fast_seconds": None if self.fast_seconds is None else round(self.fast_seconds, 1),
                "unreached": [{"item": e.item, "error": e.error} for e in self.sampled if e.prompt_tokens is None]}

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """IPython shows the lines (a notebook's ``Out[]``)."""
        printer.text(str(self))

    def __repr__(self) -> str:
        return f"<MapEstimate {self.items} items, {self.prompt_tokens} prompt tokens>"


def estimate_map(guest: Any, manifest: "MapSpec | str | os.PathLike | Sequence[Any] | Manifest", *, backend=None,
                 run_dir: str | os.PathLike | None = None, sample: int = DEFAULT_SAMPLE,
                 **job_keywords: Any) -> MapEstimate:
    """Estimate the map ``start_map`` would run with the same arguments (see the module doc): ``guest`` a
    ``JobSpec`` or a guest and its job keywords, ``manifest`` a ``MapSpec`` (its manifest and run folder) or the
    manifest. ``run_dir``: the map's run folder, whose recorded items (a map
    run before) measure the speed first."""
    if isinstance(manifest, MapSpec):  # the value form: the map's manifest and run folder
        run_dir = run_dir if run_dir is not None else manifest.run_dir
        items = manifest.manifest.items
    else:
        items = read_manifest(manifest).items
    if sample < 1:
        raise ValueError(f"sample must be at least 1, got {sample}")
    job = map_job(guest, job_keywords, "estimate_map")
    runs_dir = job.runs_dir  # where earlier runs' transcripts measure the speed; the dry runs' go to scratch
    scratch = Path(tempfile.mkdtemp(prefix="tensorjob-estimate-"))
    try:
        spec, instance = item_spec(job.replace(runs_dir=str(scratch)), backend, scratch, run_dir=run_dir)
        model_backend = instance if instance is not None else process_backend(spec.backend)
        name = getattr(model_backend, "model_name", "model")
        picks = _spread(len(items), sample)
        sampled, counted_by, prompts, unsampled = [], "tokenizer", [], 0
        timeouts = 0
        for n, index in enumerate(picks):
            if timeouts >= MAX_DRY_RUN_TIMEOUTS:
                unsampled = len(picks) - n
                break
            catcher = _FirstInfer(name)
            dry_run = Job(spec.item_job(index, items[index]), backend=catcher).start()
            timed_out = False
            try:
                envelope = dry_run.wait(DRY_RUN_TIMEOUT_S)
            except TimeoutError:
                timed_out = True
                dry_run.cancel()
                envelope = dry_run.wait()
            request = catcher.request
            if request is None:
                error = envelope.error
                why = (f"it did not reach one within {DRY_RUN_TIMEOUT_S:.0f} s" if timed_out else
                       f"{error.code}: {error.message}" if error is not None else
                       "it completed without one" if envelope.status is JobStatus.COMPLETED else envelope.status.value)
                timeouts += timed_out
                sampled.append(ItemEstimate(index, None, None, " ".join(why.split())[:300]))
                continue
            try:
                tokens = _tokens(model_backend, request)
            except ModelError as e:  # its prompt does not fit the model's context: the item would fail
                sampled.append(ItemEstimate(index, None, request.max_tokens, " ".join(str(e).split())[:300]))
                continue
            if tokens is None:
                counted_by = "characters"
                text = (request.system or "") + request.prompt
                tokens = [hash(text[i:i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN)]
            prompts.append(tokens)
            sampled.append(ItemEstimate(index, len(tokens), request.max_tokens))
        places = [Path(run_dir).absolute() / JOBS] if run_dir is not None else []
        places.append(runs_folder(runs_dir))
        return MapEstimate(len(items), name, counted_by, sampled, _shared_prefix(prompts) if len(prompts) > 1 else 0,
                           measured_speed(name, places), unsampled)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _spread(total: int, sample: int) -> list[int]:
    """``sample`` item numbers spread evenly over ``total`` (all of them when there are fewer)."""
    if total <= sample:
        return list(range(total))
    return sorted({round(i * (total - 1) / (sample - 1)) for i in range(sample)}) if sample > 1 else [0]


def _tokens(backend: Any, request: GenerateRequest) -> list[int] | None:
    """The request's prompt tokens from the model's tokenizer; None where there is none; ``ModelError``
    when the prompt is longer than the model's context."""
    count = getattr(backend, "prompt_tokens", None)
    if count is None:
        return None
    try:
        return list(count(request).result(COUNT_TIMEOUT_S))
    except ModelError as e:
        if "context window" in str(e):
            raise
        return None
    except Exception:  # noqa: BLE001 - no tokenizer after all (a served model behind a lazy backend)
        return None


def _shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt has in common."""
    first = prompts[0]
    n = len(first)
    for other in prompts[1:]:
        m = min(n, len(other))
        k = 0
        while k < m and first[k] == other[k]:
            k += 1
        n = k
    return n


def measured_speed(model: str, places: Iterable[Path]) -> Speed | None:
    """Prompt and generated tokens per second of ``model``'s recorded infers under ``places`` (folders of
    run folders), newest first; None when none are recorded. Transcripts are read as untrusted files:
    anything that is not a number where one is expected is skipped.

    Only the infers recorded on a quiet machine count when there are at least ``MIN_QUIET_INFERS`` of them
    (a map run on a busy machine would otherwise make every estimate after it too slow), and a prompt's rate
    is taken from infers decoded alone where there are enough (a batched item's time to first token counts
    the other items' prompts)."""
    runs: list[tuple[float, Path]] = []
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    runs.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
            except OSError:
                continue
    runs.sort(reverse=True)
    infers: list[_Measured] = []
    for _mtime, run in runs[:SPEED_RUNS]:
        try:
            for event in EventReader(run):
                measured = _measured(event, model)
                if measured is not None:
                    infers.append(measured)
                if len(infers) >= SPEED_INFERS:
                    break
        except (TranscriptError, OSError):
            continue
        if len(infers) >= SPEED_INFERS:
            break
    quiet = [m for m in infers if m.load is not None and m.load < QUIET_LOAD_PER_CPU]
    chosen = quiet if len(quiet) >= MIN_QUIET_INFERS else infers
    alone = [m.prompt_rate for m in chosen if m.prompt_rate and m.batch == 1]
    prompt_rates = alone if len(alone) >= MIN_QUIET_INFERS else [m.prompt_rate for m in chosen if m.prompt_rate]
    output_rates = [m.output_rate for m in chosen if m.output_rate]
    if not prompt_rates or not output_rates:
        return None
    # medians: an infer that waited for others in a batch (its time to first token counts the wait) is
    # an outlier, not the machine's speed
    return Speed(statistics.median(prompt_rates), statistics.median(output_rates), len(chosen),
                 _upper_quartile(prompt_rates), _upper_quartile(output_rates), quiet=len(quiet),
                 busy=chosen is not quiet)


@dataclass(frozen=True)
class _Measured:
    """One recorded infer's rates (0: not measured) and the conditions it ran in (None: not recorded)."""

    prompt_rate: float
    output_rate: float
    load: float | None
    batch: int | None


def _measured(event: Any, model: str) -> _Measured | None:
    """A terminal response event of ``model`` as rates, or None (another event, model or nothing usable)."""
    if not isinstance(event, dict) or event.get("type") not in ("response.completed", "response.incomplete"):
        return None
    response = _object(event.get("response"))
    if response.get("model") != model:
        return None
    usage = _object(response.get("usage"))
    timing = _object(event.get("timing"))
    details = _object(usage.get("input_tokens_details"))
    fresh = _number(usage.get("input_tokens")) - _number(details.get("cached_tokens"))
    ttft, tps = _number(timing.get("time_to_first_token_s")), _number(timing.get("tokens_per_second"))
    load = timing.get("load_per_core")
    load = float(load) if isinstance(load, (int, float)) and not isinstance(load, bool) and math.isfinite(load) \
        and load >= 0 else None
    batch = timing.get("batch")
    batch = batch if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1 else None
    return _Measured(fresh / ttft if fresh > 0 and ttft > 0 else 0.0, tps if tps > 0 else 0.0, load, batch)


def _object(value: Any) -> dict:
    """``value`` where it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _upper_quartile(values: list[float]) -> float:
    return statistics.quantiles(values, n=4)[2] if len(values) >= 2 else values[0]


def _number(value: Any) -> float:
    """A recorded count or time, or 0 when the file holds anything else there."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = [
    "DEFAULT_SAMPLE", "CHARS_PER_TOKEN", "QUIET_LOAD_PER_CPU", "MIN_QUIET_INFERS", "SPEED_RUNS", "SPEED_INFERS",
    "DRY_RUN_TIMEOUT_S", "MAX_DRY_RUN_TIMEOUTS", "COUNT_TIMEOUT_S", "STOPPED_HERE", "Speed",
    "ItemEstimate", "MapEstimate", "estimate_map", "measured_speed"
]
