"""history: past runs read back -- listed, shown again, replayed, compared.

Owns: ``runs`` (listing and pruning the runs folder, naming a run), ``show``
(a transcript played back through the same folding as a live job),
``replay`` (a guest re-run against a recording, with no model; what it
takes from the recording is ``replay_setup``, how it went ``report``), ``diff``;
and past maps: ``maps`` (a map's run folder read back, with each item's
transcript), ``map_compare`` (two maps, row by row) and ``map_replay`` (a
changed guest re-run over a recorded map, as a map of replays), ``sources`` (the excerpt of a
file around a field's source, as `show --sources` prints it).
May import: ``fanout``, ``host`` and everything below them. Never ``frontends``.
"""


__all__: list[str] = []
