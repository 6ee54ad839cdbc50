"""How many items a local map runs at once when it is not told: ``concurrency="auto"``, the default.

Items at once are sequences the model can decode together, so ``auto`` is the model's batch width (a local
engine's slots, a served model's request threads: 4 unless told) capped at twice the physical cores, since on
a CPU each sequence in a step costs compute of its own. A Dask map is not chosen here (``fanout.dask``).

Design: docs/internals/fanout.md#concurrencypy
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
