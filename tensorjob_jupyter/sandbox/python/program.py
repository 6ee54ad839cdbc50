"""A Python guest as the host carries it: source text with its file name, in one blob.

A job carries its guest as bytes (``GuestSource.wasm``: hashed, counted,
recorded, sent to map workers), so a Python guest travels as bytes too: a
header no WebAssembly module can start with (``MAGIC``), one line of JSON
(``{"filename": "cell.py"}``), then the UTF-8 source. ``is_program`` tells the
two kinds apart wherever a guest is instantiated (``sandbox.instance.open_guest``).

``guest.check_syntax`` compiles the source in the guest's own interpreter (CPython
3.14, whose grammar may differ from the host's) and raises ``PythonSyntaxError``
with the line and column, before any job starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAGIC = b"\0tjpy1\n"
#: Largest Python guest source accepted (the interpreter compiles it inside the sandbox).
MAX_SOURCE_BYTES = 4 * 1024 * 1024


class PythonSyntaxError(ValueError):
    """The guest's source does not compile: ``filename:line:col: SyntaxError: msg`` plus the line."""

    def __init__(self, message: str, *, filename: str, lineno: int | None, offset: int | None):
        super().__init__(message)
        self.message = message
        self.filename = filename
        self.lineno = lineno
        self.offset = offset


@dataclass(frozen=True)
class PythonProgram:
    source: str
    filename: str = "cell.py"

    def to_bytes(self) -> bytes:
        header = json.dumps({"filename": self.filename}, ensure_ascii=True).encode("ascii")
        return MAGIC + header + b"\n" + self.source.encode("utf-8")

    @classmethod
    def from_bytes(cls, blob: bytes) -> "PythonProgram":
        if not is_program(blob):
            raise ValueError("not a Python guest (no tensorjob Python header)")
        rest = bytes(blob[len(MAGIC):])
        header, _, body = rest.partition(b"\n")
        try:
            meta = json.loads(header)
            filename = meta["filename"]
            if not isinstance(filename, str) or not filename or len(filename) > 255:
                raise ValueError("bad file name")
            source = body.decode("utf-8")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"a malformed Python guest: {e}") from None
        return cls(source, filename)


def is_program(blob: bytes | bytearray | memoryview) -> bool:
    return bytes(blob[:len(MAGIC)]) == MAGIC


def format_syntax_error(filename: str, info: dict) -> PythonSyntaxError:
    lineno, offset = info.get("lineno"), info.get("offset")
    where = filename + (f":{lineno}" if lineno else "") + (f":{offset}" if lineno and offset else "")
    message = f"{where}: {info.get('type') or 'SyntaxError'}: {info.get('msg')}"
    text = (info.get("text") or "").rstrip("\n")
    if text:
        stripped = text.lstrip()
        message += "\n    " + stripped
        if offset:
            caret = max(0, int(offset) - 1 - (len(text) - len(stripped)))
            message += "\n    " + " " * caret + "^"
    return PythonSyntaxError(message, filename=filename, lineno=lineno, offset=offset)


__all__ = ["MAGIC", "MAX_SOURCE_BYTES", "PythonSyntaxError", "PythonProgram", "is_program", "format_syntax_error"]
