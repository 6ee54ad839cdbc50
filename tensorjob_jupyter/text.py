"""Making untrusted text safe for the place it is shown.

Every string a guest or a model produced is hostile: in a terminal it can
carry escape sequences that move the cursor, rewrite earlier lines, set the
window title or hide text; in HTML it can carry markup and script. These two
functions are the only way such text leaves the host.
"""

from __future__ import annotations

import html
import re

# ESC-based sequences: CSI (ESC [ ...), OSC (ESC ] ... BEL/ST), DCS/SOS/PM/APC
# strings, and two-byte escapes; then the 8-bit C1 forms of CSI and OSC.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x9d.*?(?:\x07|\x9c|$)",
    re.DOTALL,
)
# Remaining C0 controls except tab and newline, DEL, and C1 controls.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def for_terminal(text: str) -> str:
    """``text`` with every terminal control sequence and control character removed."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def for_html(text: str) -> str:
    """``text`` escaped for HTML content or a quoted attribute, controls removed."""
    return html.escape(for_terminal(text), quote=True)
