"""fanout: one guest mapped over many inputs -- locally, resumably, or on a Dask cluster.

    result = tj.map("summarise.wasm", "pages.jsonl", "runs/pages", read=["book.pdf"], concurrency=4)

Owns: ``errors`` (why a map refuses to start), ``manifest`` (reading and checking it), ``items`` (one item),
``map_folder`` and ``map_folder_reader`` (a map's folder: ledger, results files, lock), ``scoring``,
``progress`` (what a map reports), ``run`` (``MapRun``, the folder's only writer), ``local`` and ``dask``
(the executors), ``start`` and ``estimate``. Each item is an ordinary ``Job``; one bad item never fails the
others; a concluded item is appended and fsynced as it finishes, so the same map into the same folder resumes.
May import: ``host`` and everything under it, and the wire modules. Never ``history`` or ``frontends``.
Design: docs/internals/fanout.md#the-package
"""

from tensorjob_jupyter.fanout.errors import ClusterError, ManifestError, MapError, ResumeRefused
from tensorjob_jupyter.fanout.map_folder import MapFolder
from tensorjob_jupyter.fanout.items import WORKER_LOST, BackendSpec, ItemSpec, process_backend, run_item
from tensorjob_jupyter.fanout.manifest import Manifest, parse_manifest, read_manifest
from tensorjob_jupyter.fanout.progress import MapProgress, MapResult
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.fanout.scoring import Scored, ScoreSummary, ScoringError
from tensorjob_jupyter.fanout.start import map, start_map

__all__ = ["BackendSpec", "ClusterError", "ItemSpec", "Manifest", "ManifestError", "MapError", "MapProgress",
           "MapResult", "MapRun", "ResumeRefused", "MapFolder", "Scored", "ScoreSummary", "ScoringError",
           "WORKER_LOST", "map",
           "parse_manifest", "process_backend", "read_manifest", "run_item", "start_map"]
