"""The job view: state folded from events, its HTML, the widget, the text summary."""


__all__: list[str] = []
