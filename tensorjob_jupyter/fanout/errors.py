"""Why a map refuses to start; every one is a ``MapError``, raised before any item runs.

They live apart from what raises them (the manifest reader, the run folder,
the entry points) so that callers -- ``%%tensorjob``, ``tensorjob map`` --
can catch the one base class, and no module needs another just for its
exception.
"""

from __future__ import annotations

from tensorjob_jupyter.abi import TensorjobError


class MapError(TensorjobError):
    """A map could not start (nothing ran)."""


class ManifestError(MapError, ValueError):
    """The manifest is unreadable, has a bad line, or has no items."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class TooManyItems(ManifestError):
    """A manifest (or an expected-answers file) with more items than its reader takes, refused at the first
    extra one."""


class ResumeRefused(MapError):
    """The run folder belongs to another map, or another map is writing to it."""


class ReviewError(MapError):
    """A review that cannot be made or recorded: an unknown decision, a correction that is not JSON, a
    ``reviews.jsonl`` that cannot be written, a value that is not the map's (``reviews.py``)."""


class ScoringError(MapError):
    """Expected answers or a scorer that cannot be used: one line, before any item runs (``expected.py``,
    ``scoring.py``)."""


class ClusterError(MapError):
    """The Dask cluster cannot run this map: unreachable, no workers, or a
    worker that lacks the package, the same version of it, or the model."""


__all__ = ["MapError", "ManifestError", "TooManyItems", "ResumeRefused", "ReviewError", "ScoringError", "ClusterError"]
