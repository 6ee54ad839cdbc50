"""How many items a local map runs at once when it is not told: ``concurrency="auto"``, the default.

Items at once are sequences the model can decode together. With one at a
time the model waits while the host starts the next item (the guest, the
file window, the schema) and decodes one sequence a step; more than it
batches only queue. So ``auto`` is the model's batch width -- a local
engine's slots (4 unless ``model_options={"slots": N}``: ``ModelRef.slots``), a served model's
request threads (4) -- capped at twice the physical cores, since on a CPU
each sequence in a step costs compute of its own. Measured on 2 cores with
the embedded model (``bench/bench_map.py --vs-plain --sweep``, docs/maps.md):
a decode step of 4 sequences costs about 2.3 times a step of one, so four
at once give 1.7-2 times the tokens a second of one at a time, under load
too; a step of 2 about 1.2 times (1.7 times the tokens).

A backend object given as it is (``backend=``) says its own width with a
``slots`` attribute, else 4. A Dask map is not chosen here: it keeps twice
the cluster's threads in flight (``fanout.dask``).
"""

from __future__ import annotations

from typing import Any

from tensorjob_jupyter.inference.topology import physical_cores

AUTO = "auto"
#: The width of a model that does not say (the engine's default slots, the served client's threads).
DEFAULT_WIDTH = 4


def check_concurrency(concurrency: Any) -> int | str:
    """``concurrency`` as given -- None or ``"auto"`` (chosen), or a whole number at least 1 -- else ``ValueError``."""
    if concurrency is None or concurrency == AUTO:
        return AUTO
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a whole number at least 1 or 'auto', got {concurrency!r}")
    return concurrency


def model_width(model: Any = None, backend: Any = None) -> int:
    """How many sequences the model decodes together: a backend's ``slots``, else the ``ModelRef``'s slots,
    else ``DEFAULT_WIDTH``."""
    slots = getattr(backend, "slots", None)
    if slots is None:
        slots = getattr(model, "slots", None)
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1 else DEFAULT_WIDTH


def auto_concurrency(model: Any = None, backend: Any = None) -> int:
    """Items at once for ``concurrency="auto"``: the model's width (``model``: a ``ModelRef``), at most twice the
    physical cores."""
    return max(1, min(model_width(model, backend), 2 * physical_cores()))


__all__ = ["AUTO", "DEFAULT_WIDTH", "check_concurrency", "model_width", "auto_concurrency"]
