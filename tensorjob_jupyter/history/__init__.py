"""history: past runs read back -- listed, shown again, replayed, compared.

Owns: ``runs`` (listing and pruning the runs folder, naming a run), ``show``
(a transcript played back through the same folding as a live job),
``replay`` (a guest re-run against a recording, with no model; what it
takes from the recording is ``replay_setup``, how it went ``report``), ``diff``.
May import: ``host`` and everything below it. Never ``fanout`` or
``frontends``.
"""
