"""host: one job from ``cf_init`` to its envelope.

Owns: ``reactor`` (the step loop: every command checked and carried out),
``tokens`` (the one token loop of an ``infer``, used live and in replay),
``jobs`` (``Job``: a reactor on its own thread, the transcript, the registry),
``debugger`` (pauses between commands), ``schemas`` (a guest's JSON Schema
checked: only what a grammar enforces passes) and ``structured`` (an infer's
output: the constraint, the streamed items, the answer validated).
May import: ``sandbox``, ``world``, ``record``, ``inference``, and the wire
modules (``abi``, ``limits``, ``text``, ``version``). Never ``history``,
``fanout`` or ``frontends``.
"""
