"""mkdocs hooks: pages that show a table the package itself holds, so the site cannot drift from the code.

``<!-- limits-reference-table -->`` becomes ``limits.reference_table()``: every ``Limits`` field with its
default, unit and what it bounds (docs/api.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorjob_jupyter.limits import reference_table  # noqa: E402

MARKER = "<!-- limits-reference-table -->"


def on_page_markdown(markdown: str, **kwargs) -> str:
    return markdown.replace(MARKER, reference_table()) if MARKER in markdown else markdown
