"""What every live view shares: the column, the Cancel button, the updater thread.

A live view is a column of plain widgets, a Cancel button whose clicks run on a side thread while the cell waits
(``side_channel``), and one updater thread, the only writer of the widgets, running in the creating cell's
context. Its ``text/plain`` form is a fixed line, for nbval. Once the job or map has ended,
``finish_display()`` adds a static HTML rendering of the final view for readers that cannot run the widget.
Subclasses build their widgets and supply the updater's loop.

Design: docs/internals/frontends.md#viewlivepy
"""

from __future__ import annotations

import contextvars
import threading
from typing import Callable

import ipywidgets as w
from IPython.display import display

from tensorjob_jupyter.frontends.static_views import STATIC_VIEW
from tensorjob_jupyter.frontends.view.render import LIGHT_GREY
from tensorjob_jupyter.frontends.view.side_channel import route_clicks_to_side_thread


def check_refresh_hz(refresh_hz: float) -> float:
    """The refresh period in seconds; the rate must be in (0, 20]."""
    if not 0 < refresh_hz <= 20:
        raise ValueError("refresh_hz must be in (0, 20]")
    return 1.0 / refresh_hz


class LiveView:
    #: What a notebook stores for the view where no widget front end renders it (nbval compares it).
    text_plain = "tensorjob live view (shown by the Jupyter widget front end)"
    #: The thread that updates the view: a subclass makes it with ``_updater`` as it is constructed.
    _thread: threading.Thread

    def _cancel_button(self, tooltip: str, on_cancel: Callable[[], None]) -> w.Button:
        """A Cancel button that only asks; its clicks are handled off the main thread."""
        button = w.Button(description="Cancel", icon="stop", button_style="warning", tooltip=tooltip)
        button.on_click(lambda _button: on_cancel())
        self.clicks_off_main_thread = route_clicks_to_side_thread(button)
        return button

    def _column(self, children: list, css_class: str) -> w.VBox:
        column = w.VBox(children, layout=w.Layout(border=f"1px solid {LIGHT_GREY}", padding="4px"))
        column.add_class(css_class)
        return column

    def _updater(self, loop: Callable[[], None], name: str) -> threading.Thread:
        context = contextvars.copy_context()
        return threading.Thread(target=context.run, args=(loop,), name=name, daemon=True)

    def _finish_button(self, button: w.Button, status: str) -> bool:
        """Disable the Cancel button and show the final status; True if it changed."""
        if button.disabled:
            return False
        with button.hold_sync():
            button.disabled = True
            button.button_style = ""
            button.icon = ""
            button.description = status.capitalize()
        return True

    _display = None  # the DisplayHandle of show(), if shown so

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle or {})
        bundle["text/plain"] = self.text_plain
        return bundle

    def static_html(self) -> str:
        """The view as inert HTML, for readers without the widget (subclasses render their state)."""
        return ""

    def show(self):
        """Display the view in the running cell, so that ``finish_display`` can add its static form later."""
        self._display = display(self, display_id=True)
        return self

    def finish_display(self) -> None:
        """Add the static HTML of the final view to the output ``show()`` made (the widget stays in it)."""
        if self._display is None:
            return
        html = self.static_html()
        if html:  # marked, for exports that must show it without the widget (frontends/export.py)
            self._display.update({**self._repr_mimebundle_(), "text/html": html}, raw=True,
                                 metadata={STATIC_VIEW: True})

    def start(self):
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the view is still updating (its job or map has not ended)."""
        return self._thread.is_alive()


__all__ = ["check_refresh_hz", "LiveView"]
