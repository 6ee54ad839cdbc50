"""The guest API of a Python tensor job: ``import tensorjob as tj``.

This module runs *inside* the sandbox, in CPython compiled to WebAssembly. A guest is a script
that defines ``main(input)``: what ``main`` returns is the job's result (JSON), an uncaught
exception ends the job ``script_error`` with the guest's own traceback, and ``tj.fail(code,
message)`` ends it with a code of the guest's choosing. Everything the guest can reach is a command
of the tensor-job ABI, carried out by the host under the job's grants and limits: ``tj.infer(...)``
returns a :class:`Reply` to iterate token by token (``break`` stops the model) or read whole
(``.text``, ``.json()``), and ``tj.open`` reads granted files one bounded window at a time. It is
one file on purpose: it is the module a guest imports, built into the interpreter's snapshot, and
a guest sees its whole API in one place.

Design and an example: docs/internals/sandbox.md#pythonruntimetensorjobpy
"""

import base64 as _base64
import builtins as _builtins
import json as _json
import linecache as _linecache
import sys as _sys
import time as _time
import traceback as _traceback

from wit_world.imports import host as _host

__all__ = ["input", "open", "fetch", "infer", "embed", "emit", "fail", "emit_chunk", "flush", "input_len",
           "read_input", "File", "Image", "Reply", "STOP", "WINDOW"]

#: The job's input (also passed to ``main``).
input = None
#: Return this (or False) from an ``on_token`` callback to stop generation.
STOP = False
#: The window ``File.windows()`` and line iteration read at a time.
WINDOW = 64 * 1024
#: Most characters of a traceback the job's error keeps.
MAX_TRACEBACK_CHARS = 12_000
_MAX_LINE = 400
_LOG_FLUSH_CHARS = 8 * 1024


# --- the one channel to the host -------------------------------------------------------


class _State:
    pending = None  # the Reply being streamed whose token verdict the host awaits
    unsent: "list[Reply]" = []  # Replies made but not yet sent, oldest first
    busy = False  # inside a host exchange (a generator finalizer must not start another)


_encoder = _json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_dumps = _encoder.encode


def _exchange(cmd, stream=False):
    """Send one command (after anything owed), return the host's raw answer."""
    if _State.pending is not None or _State.unsent:
        _settle()
    if _stdout._parts or _stderr._parts:
        _flush_logs()
    _State.busy = True
    try:
        answer = _host.command(_dumps(cmd), stream)
    finally:
        _State.busy = False
    if answer[:1] == "X":
        raise ValueError(answer[1:])
    return answer


_EMITTED = 'E{"event":"emitted"}'


def _event(cmd, expect):
    answer = _exchange(cmd)
    if answer == _EMITTED and "emitted" in expect:  # the commonest answer, read without parsing
        return {"event": "emitted"}
    event = _json.loads(answer[1:])
    if event.get("event") not in expect:
        raise RuntimeError(f"the host answered {cmd.get('cmd')!r} with {event.get('event')!r}")
    return event


def _settle():
    """Before any other command: finish a stream the guest left (a verdict is owed), send unsent replies."""
    if _State.busy:
        return
    reply = _State.pending
    if reply is not None:
        reply._stop()
    while _State.unsent:
        _State.unsent[0]._send_whole()


# --- printing --------------------------------------------------------------------------


class _Log:
    """``sys.stdout``/``sys.stderr``: text goes to the job's log, a batch per command."""

    def __init__(self, stream, name):
        self._stream = stream
        self.name = name
        self._parts = []
        self._size = 0
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._parts.append(text)
            self._size += len(text)
            if self._size >= _LOG_FLUSH_CHARS:
                self.flush()
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            self._size = 0
            _host.log(self._stream, text)

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def fileno(self):
        raise OSError("the job's log has no file descriptor")


_stdout = _Log(1, "<stdout>")
_stderr = _Log(2, "<stderr>")


def _flush_logs():
    _stdout.flush()
    _stderr.flush()


# --- inference ---------------------------------------------------------------------------


def _infer_command(prompt, max_tokens, images, kw):
    if not isinstance(prompt, str):
        raise TypeError(f"infer() prompt must be str, not {type(prompt).__name__}")
    cmd = {"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens,
           "images": [i.handle if isinstance(i, (Image, File)) else i for i in images]}
    fmt = kw.pop("format", None)
    if fmt is not None:
        cmd["format"] = _format(fmt)
    tools = kw.pop("tools", None)
    if tools is not None:
        cmd["tools"] = [_tool(t) for t in tools]
    for name in ("regex", "grammar"):
        if kw.get(name) is not None and not isinstance(kw[name], str):
            raise TypeError(f"infer() {name} must be str, not {type(kw[name]).__name__}")
    choices = kw.pop("choices", None)
    if choices is not None:
        cmd["choices"] = _choices(choices)
    for name, value in kw.items():
        if value is not None:
            cmd[name] = list(value) if name == "stop" and not isinstance(value, str) else value
    return cmd


def _choices(choices):
    if isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
        raise TypeError(f"infer() choices must be a list of str, not {type(choices).__name__}")
    choices = list(choices)
    for choice in choices:
        if not isinstance(choice, str):
            raise TypeError(f"infer() choices must be a list of str, not a list holding {type(choice).__name__}")
    return choices  # an empty list, or an empty string, is the host's to refuse (ValueError here)


def _format(fmt):
    if fmt in ("json", dict):
        return {"type": "json_object"}
    if fmt in ("text", str):
        return {"type": "text"}
    if isinstance(fmt, dict):
        if fmt.get("type") in ("json_schema", "json_object", "text"):
            return fmt
        return {"type": "json_schema", "name": "answer", "schema": fmt, "strict": True}
    raise TypeError("format must be 'json', 'text', a JSON schema (dict) or an Open Responses text.format dict")


def _tool(tool):
    if isinstance(tool, dict):
        return tool
    if callable(tool):
        out = {"type": "function", "name": tool.__name__}
        if tool.__doc__:
            out["description"] = tool.__doc__.strip()
        return out
    raise TypeError("a tool is a dict ({'type': 'function', 'name': ...}) or a function")


class Reply:
    """The model's answer to one ``infer``: iterate it for tokens, or read ``.text``.

    Iterating streams the tokens as the model makes them; ``break`` (or an
    ``on_token`` callback returning ``False``) stops generation. Reading
    ``.text``, ``.tokens_out``, ``.tool_calls`` or ``.json()`` first asks for the
    whole answer at once. Iterating a reply that is already complete yields
    what it has.
    """

    def __init__(self, cmd):
        self._cmd = cmd
        self._state = "new"  # new -> streaming -> done
        self._pieces = []
        self._event = None
        self.stopped = False
        _State.unsent.append(self)

    # -- sending ----------------------------------------------------------------------

    def _take(self):
        if self in _State.unsent:
            _State.unsent.remove(self)

    def _send_whole(self):
        self._take()
        if self._state != "new":
            return
        self._state = "sending"
        self._finish(_event(self._cmd, ("infer_done",)))

    def _start_stream(self):
        """Send the command for streaming; the first answer (a token, or the end)."""
        self._take()
        _settle()
        self._state = "streaming"
        answer = _exchange(self._cmd, True)
        _State.pending = self
        return answer

    def _next(self, stop):
        _flush_logs()
        _State.busy = True
        try:
            return _host.verdict(stop)
        finally:
            _State.busy = False

    def _stop(self):
        """The guest is done with this stream: say stop, take the end."""
        if _State.pending is not self:
            return
        self.stopped = True
        answer = self._next(True)
        while answer[:1] == "T":  # a token already on its way
            answer = self._next(True)
        self._end(answer)

    def _end(self, answer):
        _State.pending = None
        self._finish(_json.loads(answer[1:]))

    def _finish(self, event):
        self._event = event
        self._state = "done"

    def _stream(self):
        answer = self._start_stream()
        try:
            while answer[:1] == "T":
                piece = answer[1:]
                self._pieces.append(piece)
                yield piece
                answer = self._next(False)
            self._end(answer)
        finally:
            if _State.pending is self and not _State.busy:
                self._stop()

    def __iter__(self):
        if self._state == "new":
            return self._stream()
        if self._state == "streaming":
            raise RuntimeError("this reply is already being iterated")
        return iter(self._pieces if self._pieces else ([self.text] if self.text else []))

    def _run_callback(self, on_token):
        for piece in self:
            if on_token(piece) is False:
                break
        return self

    # -- the answer ----------------------------------------------------------------------

    def _complete(self):
        if self._state == "new":
            self._send_whole()
        elif self._state == "streaming" and _State.pending is self and not _State.busy:
            return None
        return self._event

    @property
    def text(self):
        """The answer's text (while streaming: the text so far)."""
        event = self._complete()
        if event is None:
            return "".join(self._pieces)
        return event.get("text", "")

    @property
    def tokens_out(self):
        event = self._complete()
        return len(self._pieces) if event is None else event.get("tokens_out", 0)

    @property
    def tool_calls(self):
        """The model's tool calls: ``[{"call_id", "name", "arguments"}]`` (arguments parsed), or []."""
        event = self._complete() or {}
        calls = []
        for call in event.get("tool_calls") or ():
            call = dict(call)
            try:
                call["arguments"] = _json.loads(call.get("arguments") or "null")
            except ValueError:
                pass
            calls.append(call)
        return calls

    @property
    def logprobs(self):
        """Each token's ``{"token", "logprob", "bytes", "top_logprobs", "runner_up_logprob"}``, in order, when
        the infer asked (``logprobs=True`` or ``top_logprobs=N``) and the model gave them; else None."""
        event = self._complete() or {}
        records = event.get("logprobs")
        return list(records) if isinstance(records, list) else None

    def confidence(self, field=""):
        """How sure the model was of the answer's ``field`` (a dotted path, ``"facts.authors.1"``; ``""``: a
        choice or a regex match), 0 to 1; None when the infer did not ask for logprobs, the model gave none,
        or the answer has no such field (docs/guests.md, "Confidence")."""
        event = self._complete() or {}
        fields = event.get("confidence")
        value = fields.get(field) if isinstance(fields, dict) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def done(self):
        return self._state == "done"

    def json(self):
        """The answer parsed as JSON (for ``format=``)."""
        return _json.loads(self.text)

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<Reply {self._state}: {self.text[:60]!r}>" if self._state == "done" else f"<Reply {self._state}>"


def infer(prompt, *, max_tokens=256, images=(), format=None, tools=None, tool_choice=None, temperature=None,
          top_p=None, top_k=None, min_p=None, repeat_penalty=None, seed=None, stop=None, regex=None, choices=None,
          grammar=None, logprobs=False, top_logprobs=None, on_token=None):
    """Ask the job's model. Returns a :class:`Reply` (iterate it to stream tokens).

    ``format``: ``"json"``, a JSON schema (dict), or an Open Responses
    ``text.format`` dict; ``tools``: function tools (dicts, or functions named
    by their ``__name__``); the sampling keywords override the job's sampler
    for this infer. With ``on_token=fn`` the call streams at once, calls
    ``fn(piece)`` per token (``False`` stops), and returns the complete reply.

    The answer can be held to a shape while the model decodes (at most one
    of ``format``, ``regex``, ``choices``, ``grammar`` and ``tools``, and
    never with ``stop``):

    * ``regex="[0-9]{4}-[0-9]{2}-[0-9]{2}"``: the whole answer matches the
      regular expression (Rust's ``regex`` syntax, implicitly anchored);
    * ``choices=["positive", "negative", "neutral"]``: the answer is exactly
      one of these strings;
    * ``grammar='start: ("yes" | "no") ", because " /[a-z ]{1,40}/'``: the
      answer is a sentence of this Lark grammar (llguidance's dialect, from
      its ``start`` rule).

    A constraint the host cannot enforce (a regex that does not parse, a rule
    the grammar never defines) ends the job ``schema_validation_failed`` before
    any token, with one line saying why; an empty ``choices`` list is the
    guest's own ``ValueError``. Give ``max_tokens`` room for the whole
    answer: one cut short does not match, and ends the job.
    """
    cmd = _infer_command(prompt, max_tokens, images, {
        "format": format, "tools": tools, "tool_choice": tool_choice, "temperature": temperature,
        "top_p": top_p, "top_k": top_k, "min_p": min_p, "repeat_penalty": repeat_penalty, "seed": seed,
        "stop": stop, "regex": regex, "choices": choices, "grammar": grammar,
        "logprobs": True if logprobs else None, "top_logprobs": top_logprobs})
    reply = Reply(cmd)
    if on_token is not None:
        return reply._run_callback(on_token)
    return reply


def embed(texts):
    """Embedding vectors: one list of floats for a str, a list of them for a list of str."""
    single = isinstance(texts, str)
    items = [texts] if single else list(texts)
    event = _event({"cmd": "embed", "texts": items}, ("embedded",))
    vectors = event.get("vectors", [])
    return vectors[0] if single else vectors


# --- files, documents, images -----------------------------------------------------------


class Image:
    """An image the host holds (a rendered page, a resize, a crop): named by handle, never copied in."""

    def __init__(self, handle, size):
        self.handle = handle
        self.size = size

    def _op(self, op):
        event = _event({"cmd": "image_op", "handle": self.handle, "op": op}, ("page_imaged",))
        return Image(event["handle"], event["len"])

    def resize(self, max_width, max_height):
        return self._op({"op": "resize", "max_width": max_width, "max_height": max_height})

    def crop(self, x, y, width, height):
        return self._op({"op": "crop", "x": x, "y": y, "width": width, "height": height})

    def __repr__(self):
        return f"<Image handle={self.handle} bytes={self.size}>"


class File:
    """A granted file (or a fetched URL), read in windows the host cuts.

    ``open(path)`` gives text (windows end on a UTF-8 boundary), ``open(path,
    "rb")`` bytes. ``read()``, ``readline()``, line iteration, ``seek``/``tell``
    (byte offsets) and ``windows(size)`` all go through ``slice`` commands;
    a document adds ``pages``, ``page_text(i)``, ``page_text_opt(i)``,
    ``text()`` and ``page_image(i)``.
    """

    def __init__(self, name, event, binary):
        self.name = name
        self.handle = event["handle"]
        self.size = event["len"]
        kind = event.get("kind") or {"kind": "text"}
        self.kind = kind.get("kind", "text")
        self.pages = kind.get("pages")
        self.has_text_layer = kind.get("has_text_layer")
        self.format = kind.get("format")
        self.binary = binary
        self.closed = False
        self._pos = 0
        self._buffer = "" if not binary else b""

    def __len__(self):
        return self.size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.closed = True

    def tell(self):
        return self._pos - len(self._buffer.encode("utf-8") if not self.binary else self._buffer)

    def seek(self, offset, whence=0):
        base = {0: 0, 1: self.tell(), 2: self.size}[whence]
        self._pos = max(0, base + offset)
        self._buffer = "" if not self.binary else b""
        return self._pos

    def _window(self, size):
        """One window at the read position (text or bytes); empty at the end."""
        if self._pos >= self.size:
            return b"" if self.binary else ""
        if self.binary:
            event = _event({"cmd": "slice_bytes", "handle": self.handle, "offset": self._pos, "len": size},
                           ("sliced_bytes",))
            data = _base64.b64decode(event["bytes_base64"])
        else:  # at least 4 bytes, so one character always fits
            event = _event({"cmd": "slice", "handle": self.handle, "offset": self._pos, "len": max(size, 4)},
                           ("sliced",))
            data = event["text"]
        self._pos = event["next_offset"]
        return data

    def windows(self, size=WINDOW):
        """Windows of at most ``size`` bytes from the read position to the end."""
        if self._buffer:
            buffered, self._buffer = self._buffer, self._buffer[:0]
            yield buffered
        while True:
            data = self._window(size)
            if not data:
                return
            yield data

    def read(self, size=-1):
        """Up to ``size`` bytes' worth (all when negative): str, or bytes for "rb"."""
        if size is None or size < 0:
            return (b"" if self.binary else "").join(self.windows(1024 * 1024))
        if self._buffer:
            out, self._buffer = self._buffer, self._buffer[:0]
            return out
        return self._window(size)

    def readline(self):
        empty = b"" if self.binary else ""
        nl = b"\n" if self.binary else "\n"
        while True:
            i = self._buffer.find(nl)
            if i >= 0:
                line, self._buffer = self._buffer[:i + 1], self._buffer[i + 1:]
                return line
            data = self._window(WINDOW)
            if not data:
                line, self._buffer = self._buffer, empty
                return line
            self._buffer += data

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def readlines(self):
        return list(self)

    # -- documents ------------------------------------------------------------------------

    def page_text(self, page):
        return _event({"cmd": "page_text", "handle": self.handle, "page": page}, ("page_texted",))["text"]

    def page_text_opt(self, page):
        """The page's text, or None when it has none (``.last_error`` says why)."""
        event = _event({"cmd": "page_text_opt", "handle": self.handle, "page": page}, ("page_text_attempted",))
        self.last_error = event.get("error")
        return event.get("text")

    def text(self):
        """All of a document's text (``document_text``)."""
        return _event({"cmd": "document_text", "handle": self.handle}, ("page_texted",))["text"]

    def page_image(self, page):
        event = _event({"cmd": "page_image", "handle": self.handle, "page": page}, ("page_imaged",))
        return Image(event["handle"], event["len"])

    def __repr__(self):
        return f"<File {self.name!r} {self.kind} {self.size} bytes>"


def open(path, mode="r"):
    """Open a file the job grants: ``"r"`` (text windows) or ``"rb"`` (bytes)."""
    if mode not in ("r", "rt", "rb"):
        raise ValueError(f"a guest opens files to read them: mode 'r' or 'rb', not {mode!r}")
    if not isinstance(path, str):
        path = getattr(path, "__fspath__", lambda: path)()
        if not isinstance(path, str):
            raise TypeError("open() path must be str")
    return File(path, _event({"cmd": "open", "path": path}, ("opened",)), mode == "rb")


def fetch(url, mode="r"):
    """Download a URL the job grants (``--fetch PREFIX``); read it like an opened file."""
    return File(url, _event({"cmd": "fetch", "url": url}, ("opened",)), mode == "rb")


# --- progress, streaming output, the end --------------------------------------------------


def emit(progress=None, **fields):
    """Publish progress (any JSON value, or keywords as an object) to the job's view."""
    if fields:
        progress = dict(progress or {}, **fields)
    _event({"cmd": "emit", "progress": progress}, ("emitted",))


def fail(code, message=""):
    """End the job as failed with ``code`` (e.g. ``"not_found"``) and ``message``. Never returns."""
    _exchange({"cmd": "fail", "code": str(code), "message": str(message)})
    raise SystemExit("the job has ended")  # not reached: the host ends the job


def emit_chunk(data):
    """Stream output (bytes, or str as UTF-8): 0 accepted, -1 disabled, -2 over a cap, -3 nobody listens."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    data = bytes(data)
    _flush_logs()
    return _host.emit_chunk(data.decode("latin-1"))


def flush():
    _flush_logs()
    return _host.flush()


def input_len():
    """Bytes the caller staged for the job (``--input-file``)."""
    return _host.input_len()


def read_input(size=-1, offset=0):
    """The staged input bytes from ``offset`` (all when ``size`` is negative)."""
    total = _host.input_len()
    size = total - offset if size is None or size < 0 else size
    out = []
    while size > 0 and offset < total:
        part = _host.read_input(offset, min(size, 4 * 1024 * 1024)).encode("latin-1")
        if not part:
            break
        out.append(part)
        offset += len(part)
        size -= len(part)
    return b"".join(out)


# --- running a guest (called by the interpreter's export) -----------------------------------


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _host.sleep(int(seconds * 1_000_000_000))


def _clip(line):
    return line if len(line) <= _MAX_LINE else line[:_MAX_LINE] + "..."


def _traceback_text(exc, filename):
    """The guest's traceback: its own frames only, bounded, line numbers as in its file."""
    try:
        te = _traceback.TracebackException(type(exc), exc, exc.__traceback__, limit=None, compact=True)
        for t in [te, *([te.__cause__] if te.__cause__ else []), *([te.__context__] if te.__context__ else [])]:
            stack = [f for f in t.stack if f.filename == filename]
            if len(stack) > 40:
                stack = stack[:10] + stack[-30:]
            t.stack = _traceback.StackSummary.from_list(stack)
        lines = [_clip(line) for chunk in te.format() for line in chunk.splitlines()]
        text = "\n".join(lines)
        if len(text) > MAX_TRACEBACK_CHARS:
            text = text[:2000] + "\n...\n" + text[-(MAX_TRACEBACK_CHARS - 2000):]
        return text
    except BaseException:  # noqa: BLE001 - out of memory while formatting: say what we can
        try:
            return f"{type(exc).__name__} (the traceback could not be formatted)"
        except BaseException:  # noqa: BLE001
            return "the guest raised an exception"


def _fail_json(message):
    return _dumps({"cmd": "fail", "code": "script_error", "message": message})


def _reset():
    global input
    input = None
    _State.pending = None
    _State.unsent = []
    _State.busy = False


def _main_takes_input(main):
    code = getattr(main, "__code__", None)
    return code is None or code.co_argcount >= 1 or bool(code.co_flags & 0x04)  # an argument, or *args


def _run(source, filename, input_json):
    """Compile and run a guest; the JSON of its last command (done or fail)."""
    global input
    _reset()
    _sys.stdout, _sys.stderr = _stdout, _stderr
    _time.sleep = _sleep
    import os
    import random
    random.seed(int.from_bytes(os.urandom(16), "little"))  # the host's recorded, seeded source
    try:
        input = _json.loads(input_json)
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except SyntaxError as e:
            return _fail_json(f"SyntaxError: {e.msg} ({filename}, line {e.lineno}, column {e.offset})")
        _linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        scope = {"__name__": "__guest__", "__file__": filename, "__builtins__": _builtins}
        _host.ready()
        exec(code, scope)
        main = scope.get("main")
        if not callable(main):
            return _fail_json(f"{filename} defines no main(input) function to run")
        result = main(input) if _main_takes_input(main) else main()
        _settle()
        try:
            out = _dumps({"cmd": "done", "result": result})
        except (TypeError, ValueError) as e:
            return _fail_json(f"main() returned a value that is not JSON: {e}")
    except BaseException as e:  # noqa: BLE001 - the guest's own failure, reported as its traceback
        try:
            _settle()
        except BaseException:  # noqa: BLE001
            pass
        out = _fail_json(_traceback_text(e, filename))
    try:
        _flush_logs()
    except BaseException:  # noqa: BLE001
        pass
    return out


def _check(source, filename):
    """"" when ``source`` compiles, else its SyntaxError as JSON."""
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        return _dumps({"msg": str(e.msg), "lineno": e.lineno, "offset": e.offset,
                       "end_lineno": getattr(e, "end_lineno", None), "end_offset": getattr(e, "end_offset", None),
                       "text": (e.text or "")[:_MAX_LINE], "type": type(e).__name__})
    except (ValueError, TypeError) as e:
        return _dumps({"msg": str(e), "lineno": None, "offset": None, "text": "", "type": type(e).__name__})
    return ""
