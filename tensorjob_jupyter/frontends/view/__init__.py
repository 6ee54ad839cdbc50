"""The views: a job's state folded from events, its HTML, its widget, a map's widget, the review widget.

Owns: ``state`` (a job's events folded into what the view shows), ``render`` (that state as escaped HTML, and the
colours), ``widget`` and ``live`` (the job's live widget and the updater thread every view shares), ``scrub``
(stepping through a finished job), ``side_channel`` (the kernel's comm for a busy kernel), ``summary`` (the text
summary), ``map_widget`` (a map's live view), ``in_flight`` (the items it runs now), ``cascade_panel`` (a
cascade's phases, sample and threshold in that view) and ``review_widget`` (a map's values reviewed one at a time).
"""


__all__: list[str] = []
