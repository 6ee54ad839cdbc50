"""The items a map runs now, in its live view: each one's key, phase, tokens and the end of its text so far.

A map lists items as they end; a long item would leave the view empty for its whole first answer. So the map view
asks ``MapRun.in_flight()`` at each of its updates (never per token: the job keeps a ``Glimpse`` and the view
reads it at its own rate) and renders the first ``SHOW_IN_FLIGHT`` here, every string clipped and escaped (keys
come from a manifest, text from a model).
"""

from __future__ import annotations

from typing import Sequence

from tensorjob_jupyter.fanout.run import InFlight
from tensorjob_jupyter.frontends.view.render import BLUE, GREY
from tensorjob_jupyter.text import for_html

#: Items in flight the view lists (the rest are counted).
SHOW_IN_FLIGHT = 8
#: Characters of a key, and of the end of the text, a row shows.
KEY_CHARS = 32
TAIL_CHARS = 80

NOWRAP = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


def clipped_end(text: str, limit: int) -> str:
    """The end of ``text`` on one line, at most ``limit`` characters, ``…`` where it was cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def clipped_start(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render_in_flight(flights: Sequence[InFlight]) -> str:
    """The items running now, one row each (see the module doc); nothing when none is."""
    if not flights:
        return ""
    cell = f"padding:1px 6px;{NOWRAP}"
    rows = "".join(
        f'<tr class="tj-map-in-flight-item"><td style="{cell};color:{GREY};width:4ch;text-align:right">{f.item}</td>'
        f'<td style="{cell};width:25%">{for_html(clipped_start(f.key, KEY_CHARS))}</td>'
        f'<td class="tj-map-phase" style="{cell};width:18ch;color:{BLUE}">{for_html(f.glimpse.phase)}</td>'
        f'<td style="{cell};width:8ch;color:{GREY}">{f.glimpse.tokens} tok</td>'
        f'<td class="tj-map-tail" style="{cell};max-width:0">{for_html(clipped_end(f.glimpse.tail, TAIL_CHARS))}</td>'
        f'</tr>' for f in flights[:SHOW_IN_FLIGHT])
    more = len(flights) - SHOW_IN_FLIGHT
    note = (f'<div style="font-family:sans-serif;font-size:11px;color:{GREY}">and {more} more running</div>'
            if more > 0 else "")
    return (f'<div class="tj-map-in-flight"><div style="font-family:sans-serif;font-size:11px;color:{GREY}">'
            f'running now</div><table style="font-family:monospace;font-size:11px;border-collapse:collapse;'
            f'table-layout:fixed;width:100%;line-height:1.4"><tbody>{rows}</tbody></table>{note}</div>')


__all__ = ["SHOW_IN_FLIGHT", "KEY_CHARS", "TAIL_CHARS", "clipped_end", "clipped_start", "render_in_flight"]
