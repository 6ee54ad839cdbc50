"""fanout: one guest mapped over many inputs -- locally, resumably, or on a Dask cluster.

    result = tj.map("summarise.wasm", "pages.jsonl", "runs/pages", read=["book.pdf"], concurrency=4)

Owns: ``errors`` (why a map refuses to start), ``manifest``, ``items`` (one item), ``item_set`` (which items a session
runs), ``map_folder`` and ``map_folder_reader`` (ledger, results files, lock), ``group_commit`` (one fsync for many
items), ``expected``, ``scoring``, ``score_interval``, ``score_summary`` (expected answers, scorers, intervals, the
summary table) and ``calibration``, ``progress`` (what a map reports), ``run`` (``MapRun``, the folder's only writer
of results), ``local``, ``dask``, ``concurrency`` (the executors, how many at once), ``map_spec`` (a map's checked
settings), ``start``, ``estimate``; the review: ``review_rows`` (each value, doubtful first), ``reviews`` (a person's decisions), ``certify`` (the sample
and its bound), ``review_queue`` (what a front end drives); a cascade of two models: ``cascade`` (``CascadeRun``),
``cascade_bound`` (its threshold, certified), ``cascade_score``.
Each item is an ordinary ``Job``; one bad item never fails the others; a concluded item is fsynced as it ends.
May import: ``host`` and everything under it, and the wire modules. Never ``history`` or ``frontends``.
Design: docs/internals/fanout.md#the-package
"""

from tensorjob_jupyter.fanout.errors import (
    ClusterError, ManifestError, MapError, ResumeRefused, ReviewError, ScoringError,
)
from tensorjob_jupyter.fanout.map_folder import MapFolder
from tensorjob_jupyter.fanout.items import WORKER_LOST, BackendSpec, ItemSpec, process_backend, run_item
from tensorjob_jupyter.fanout.manifest import Manifest, parse_manifest, read_manifest
from tensorjob_jupyter.fanout.progress import MapProgress, MapResult
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.fanout.review_queue import ReviewQueue
from tensorjob_jupyter.fanout.scoring import Scored
from tensorjob_jupyter.fanout.score_summary import ScoreSummary
from tensorjob_jupyter.fanout.start import map, start_map

__all__ = ["BackendSpec", "ClusterError", "ItemSpec", "Manifest", "ManifestError", "MapError", "MapProgress",
           "MapResult", "MapRun", "ResumeRefused", "ReviewError", "ReviewQueue", "MapFolder", "Scored", "ScoreSummary",
           "ScoringError", "WORKER_LOST", "map", "parse_manifest", "process_backend", "read_manifest", "run_item",
           "start_map"]
