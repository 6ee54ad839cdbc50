"""record: what a job leaves behind -- the ordered event stream, the Open Responses
events of each infer, the transcript on disk and its one reader, the runs folder.

Owns: ``events`` (the stream, written then published), ``responses`` (one
``infer`` as an Open Responses response), ``transcript`` (reading a run back)
with ``event_checks`` (every value checked as input from anywhere) and
``recording`` (the commands a run records), ``glimpse`` (what a running job
does now, for a view of many), ``job_folder`` (the runs
folder's layout: its file names, where it is, whether a run is live).
May import: ``abi``, ``limits``, ``text``, ``version``. Nothing above.
"""


__all__: list[str] = []
