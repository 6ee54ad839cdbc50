"""Map one guest over many inputs: locally, resumably, or on a Dask cluster.

    result = tj.map("summarise.wasm", "pages.jsonl", "runs/pages", read=["book.pdf"],
                    concurrency=4)                       # or cluster="tcp://scheduler:8786"

Each non-blank line of the manifest (JSONL) is one item; its JSON value is
that item's job input. Items are numbered from 0 in manifest order, counting
only non-blank lines, so item ``i`` is the ``i``-th JSON value. Every item is
an ordinary ``Job`` with the same guest, read grants, limits and model. One
bad item never fails the others: it is recorded with its error and the map
goes on.

The run folder is the map's ledger (cuttlefish's fan-out, reference §9.5):

    ledger.json      what this folder is: the manifest's SHA-256, the guest's
                     SHA-256, the item count, one entry per session
    results.jsonl    {"item": i, "key": k, "result": ..., "sources": ..., "confidence": ...}
                                                                                per completed item
    failures.jsonl   {"item": i, "key": k, "error": {"code": ..., "message": ...}} per failed item
    jobs/            each item's job transcript (events.jsonl, envelope.json)

Lines are appended, flushed and fsynced as each item finishes, so a crash
loses nothing already finished (a torn last line is cut off on resume and
its item runs again). Lines are appended in finishing order; when the map
ends they are rewritten in item order (manifest order). ``k`` is the item's
key, what names it to a person (``manifest.item_key``: its ``id``, ``key``,
``name``, ``path``, ``file`` or ``url`` field, else its number). Running
the same map into the same folder resumes it: items already *concluded*
(completed or failed, as in cuttlefish) are skipped; ``retry_failed=True``
runs the failed ones again. A folder started with a different manifest or a
different guest is refused (``ResumeRefused``), since mixing them would make
the results files lie. An item whose job was cancelled (the map was
cancelled) is not concluded: it runs on resume.

The manifest is read and checked completely before any item runs: a line
that is not UTF-8 or not JSON, or a manifest with no items, raises
``ManifestError`` naming the 1-based line number in the file.

Where items run is an executor with one method, ``run(todo, sink)``: the
local one here (``concurrency`` jobs at a time on threads, sharing this
process's model backend), or the Dask one in ``fanout.dask`` (imported only
when a cluster is named). Both hand every finished item's outcome -- a small
picklable dict -- to the ``MapRun``, the only writer of the run folder and
the owner of the live counters the notebook view reads (``progress()``,
``subscribe()``, ``wait_for_update()``).

The command line (``tensorjob map``) lives with the other front ends (``frontends.map_cli``).

The package, one responsibility a module, each depending only on those above it:

    errors.py     MapError, ManifestError, ResumeRefused, ClusterError: why a map refuses to start
    manifest.py   reading and checking the manifest
    items.py      one item: ItemSpec, the backend per process, run_item
    folder.py     the run folder: ledger, results files, lock
    scoring.py    expected answers, scorers, each item's score and the summary
    progress.py   MapProgress, MapResult, ItemTimes: what a map reports
    run.py        MapRun: the live map, the run folder's only writer
    local.py      LocalExecutor: items on threads in this process
    dask.py       DaskExecutor: items as Dask tasks (needs distributed)
    start.py      start_map and map: check everything, pick the executor, start
    estimate.py   estimate_map: what a map will cost, before it runs (nothing decoded)

Past maps read back, compared and replayed with a changed guest are ``history``'s
(``history/maps.py``, ``map_compare.py``, ``map_replay.py``).
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
