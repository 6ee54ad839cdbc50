"""Reading a model server's answer as it streams: text, a tool call, token records and the usage, all checked.

``read_answer`` walks the SSE events of one answer (each already bounded in bytes on the wire:
``served_transport``) and delivers whole characters to the job as they come, cut at its stop strings and at
``max_tokens`` whatever the server does; ``CallText`` turns streamed ``tool_calls`` deltas into the host's call
JSON; ``Records`` carries each token's logprob record with the text it came in; ``usage_of`` takes only the
counts a transcript can hold. Everything the server sends is untrusted JSON: ``field`` and ``count`` read it
by kind. Apart from the backend because it is pure reading: no socket, no thread, no request state but the
``Call`` it reports pieces to.

Design: docs/internals/inference.md#what-maps-to-the-request
"""

from __future__ import annotations

import json
from typing import Any, Callable

from tensorjob_jupyter.abi import MAX_COUNT
from tensorjob_jupyter.inference.base import (FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, ConstraintError,
                                              GenerateRequest, GenerateUsage, ModelError, TokenCallback)
from tensorjob_jupyter.inference.logprobs import TokenLogprob, TokenText, read_openai_logprobs
from tensorjob_jupyter.inference.served_transport import Call
from tensorjob_jupyter.inference.text_stream import TextStream

#: The alternatives asked of a server with each token's logprob, at least: the chosen token and the best
#: other, which a choice's confidence is measured against.
RUNNER_UP_TOP = 2


class CallText:
    """The host's tool-call text, ``{"name": NAME, "arguments": ARGUMENTS}``, from a server's streamed
    ``tool_calls`` deltas: the name once it is known, then each piece of the arguments as it arrives.

    The host reads, checks and reports that text as it does the local model's (``host/structured.py``),
    so a call's arguments that are not the JSON its schema asks for fail the same way. One call a
    response: a delta for another call (another index, or the same index with another id) sets
    ``another`` and the answer ends with the first. Text and a call in one answer is the model's
    output breaking its shape: ``ConstraintError`` (``schema_validation_failed``), like a bad call.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self.index: Any = None
        self.id: Any = None
        self.another = False
        #: blank text before anything else: it waits until the answer is known to be text, not a call
        self.held = ""
        self.text_seen = False

    @property
    def started(self) -> bool:
        return self.name is not None

    def text_piece(self, piece: Any) -> Any:
        """What of a content piece reaches the answer: leading blanks wait (a call may follow them);
        text once a call has begun is refused."""
        if not piece or not isinstance(piece, str):
            return piece
        if self.started:
            if piece.strip():
                raise ConstraintError("the model answered with a tool call and then text; "
                                      "a response holds one or the other")
            return None
        if not self.text_seen:
            if not piece.strip():
                self.held += piece
                return None
            self.text_seen = True
            piece, self.held = self.held + piece, ""
        return piece

    def feed(self, deltas: Any) -> str:
        """The text these deltas add (may be empty)."""
        if self.text_seen:
            raise ConstraintError("the model answered with text and then a tool call; "
                                  "a response holds one or the other")
        if not isinstance(deltas, list):
            raise ModelError("the model server's stream is malformed: tool_calls is not a list")
        out = []
        for delta in deltas:
            if not isinstance(delta, dict):
                raise ModelError("the model server's stream is malformed: a tool call is not an object")
            index = delta.get("index")
            index = 0 if index is None else index  # a server that sends no index streams one call
            call_id = delta.get("id")
            if self.name is None:
                self.index, self.id = index, call_id
            elif index != self.index or (call_id and self.id and call_id != self.id):
                self.another = True  # another call: a new index, or the same index with a new id
                break
            function = delta.get("function")
            function = function if isinstance(function, dict) else {}
            name, arguments = function.get("name"), function.get("arguments")
            if self.name is None:
                if not isinstance(name, str) or not name:
                    raise ModelError("the model server's stream is malformed: a tool call begins without a name")
                self.name = name
                out.append('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
            elif name not in (None, "", self.name):
                raise ModelError("the model server's stream is malformed: a tool call changes its name")
            if arguments:
                if not isinstance(arguments, str):
                    raise ModelError("the model server's stream is malformed: a tool call's arguments are not text")
                out.append(arguments)
        return "".join(out)

    def close(self) -> str:
        return "}"


class Records:
    """The token records a served answer carries (``choices[0].logprobs``), handed on with its text.

    Records wait (``take``) until text is delivered, and go with it (``carried_by``): a stop string's
    lookahead can hold text back past the chunk its tokens came in. At most ``max_tokens`` records are
    taken, each with at most the ``asked`` alternatives (and the chosen token: OpenAI's legacy answer may
    add it) read and ``top`` kept. A record that is not one, or a chunk whose records would pass
    ``max_tokens`` (counted before any is read), ends the records of this answer (``delivered`` keeps those
    handed on), and the text goes on without them."""

    def __init__(self, max_tokens: int, top: int, asked: int = RUNNER_UP_TOP):
        self.max_tokens = max(0, int(max_tokens))
        self.top = top
        self.asked = max(int(asked), int(top))
        self.waiting: list[TokenLogprob] = []
        self.delivered: list[TokenLogprob] | None = None  # None: the server gave none
        self.broken = False

    def take(self, value: Any) -> None:
        if self.broken:
            return
        taken = len(self.waiting) + len(self.delivered or ())
        try:
            got = read_openai_logprobs(value, self.top, most=self.max_tokens - taken, read=self.asked + 1)
        except ValueError:
            self.broken, self.waiting = True, []
            return
        self.waiting += got

    def carried_by(self, text: str) -> str:
        if not self.waiting:
            return text
        records, self.waiting = self.waiting, []
        if self.delivered is None:
            self.delivered = []
        self.delivered.extend(records)
        return TokenText(text, records)


def read_answer(call: Call, stream: Any, request: GenerateRequest, on_token: TokenCallback, chat: bool,
                native_tools: bool = False, records: Records | None = None) -> tuple[str, Any]:
    """Read the answer ``stream`` carries (the SDK's stream of parsed JSON events), its text delivered to
    ``on_token`` as it comes (with the token records ``records`` reads off it, when logprobs were asked) and
    kept in ``call.parts``: how it finished, and the server's usage object (None when the job stopped it)."""
    text_stream = TextStream(request.sampler.stop)
    tool_call = CallText() if native_tools else None
    events = 0
    max_events = 4 * request.max_tokens + 64
    finish: str | None = None
    usage = None

    def deliver(text: str) -> bool:
        call.parts.append(text)
        if records is not None:
            text = records.carried_by(text)
        try:
            return bool(on_token(text))
        except BaseException:  # noqa: BLE001 - a dead listener means stop
            return False

    with stream:
        for chunk in stream:
            events += 1
            if events > max_events:
                raise ModelError(f"the model server's stream is malformed: more than {max_events} events "
                                 f"for {request.max_tokens} tokens")
            if not isinstance(chunk, dict):
                raise ModelError("the model server's stream is malformed: an event is not a JSON object")
            got = chunk.get("usage")
            if isinstance(got, dict):
                usage = got
            for choice in field(chunk, "choices", list) or ():
                if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                    continue
                if records is not None and choice.get("logprobs") is not None:
                    records.take(choice["logprobs"])
                delta = choice.get("delta") if chat else None
                delta = delta if isinstance(delta, dict) else {}
                piece = delta.get("content") if chat else choice.get("text")
                if tool_call is not None:
                    piece = tool_call.text_piece(piece)
                    if delta.get("tool_calls"):
                        if call.pieces >= request.max_tokens:
                            return _ended(FINISH_LENGTH, usage, None, deliver, tool_call)
                        text = tool_call.feed(delta["tool_calls"])
                        if text:
                            call.arrived()
                            if not deliver(text):
                                return _ended(FINISH_CANCELLED, None, None, deliver)
                        if tool_call.another:  # one call a response: the answer is the first
                            return _ended(FINISH_STOP, usage, None, deliver, tool_call)
                if piece:
                    if not isinstance(piece, str):
                        raise ModelError("the model server's stream is malformed: a text piece is not a string")
                    if call.pieces >= request.max_tokens:  # the server ignores max_tokens: cut it here
                        return _ended(FINISH_LENGTH, usage, text_stream, deliver)
                    call.arrived()
                    text, stopped = text_stream.push(piece.encode("utf-8", "replace"))
                    if text and not deliver(text):
                        return _ended(FINISH_CANCELLED, None, None, deliver)
                    if stopped:
                        return _ended(FINISH_STOP, usage, None, deliver)
                reason = choice.get("finish_reason")
                if reason:
                    finish = FINISH_LENGTH if reason == "length" else FINISH_STOP
    if finish is None:
        raise ModelError("the model server's stream ended before the answer did (no finish_reason)")
    return _ended(finish, usage, text_stream, deliver, tool_call)


def _ended(finish: str, usage: Any, text_stream: TextStream | None, deliver: Callable[[str], bool],
           tool_call: CallText | None = None) -> tuple[str, Any]:
    """The answer ends (``finish``): what is still held is delivered -- a tool call's close, blanks held for a
    call that never came, the text stream's tail -- and ``finish`` and ``usage`` are handed back."""
    if tool_call is not None and tool_call.started:
        if finish != FINISH_LENGTH:  # a call cut at max_tokens stays open: it fails as the JSON it is
            deliver(tool_call.close())
        return finish, usage
    if tool_call is not None and tool_call.held and text_stream is not None:  # an answer of blanks only
        text, _ = text_stream.push(tool_call.held.encode("utf-8"))
        if text:
            deliver(text)
    if text_stream is not None:
        tail = text_stream.flush()
        if tail:
            deliver(tail)
    return finish, usage


def usage_of(usage: Any, call: Call) -> GenerateUsage:
    """The usage of ``call``'s answer: the server's counts (``usage``, its JSON object or None), each a whole
    number from 0 to 2^53 or not taken -- no answer has more tokens than were asked for, and no prompt more
    cached tokens than it has -- else the pieces that arrived; the timings are the call's own."""
    pieces, started, first_at, last_at = call.pieces, call.started, call.first_at, call.last_at
    prompt = count(field(usage, "prompt_tokens", int))
    completion = count(field(usage, "completion_tokens", int))
    if completion is not None and call.max_tokens:
        completion = min(completion, call.max_tokens)
    cached = count(field(field(usage, "prompt_tokens_details", dict), "cached_tokens", int))
    if cached is not None:
        cached = min(cached, prompt or 0)
    tps = ((pieces - 1) / (last_at - first_at)
           if pieces > 1 and last_at and first_at is not None and last_at > first_at else None)
    return GenerateUsage(prompt_tokens=prompt or 0, completion_tokens=completion if usage is not None
                         and completion is not None else pieces, cached_tokens=cached or 0,
                         time_to_first_token_s=(first_at - started) if first_at and started is not None else None,
                         tokens_per_second=tps)


def mean_pooled(rows: list[list]) -> list[float] | None:
    """The mean of per-token vectors, as the local engine pools; None when they are not all numbers of one width."""
    width = len(rows[0])
    if any(len(r) != width or not all(isinstance(x, (int, float)) for x in r) for r in rows):
        return None
    return [sum(float(r[i]) for r in rows) / len(rows) for i in range(width)]


def field(obj: Any, key: str, kind: type) -> Any:
    """``obj[key]`` when ``obj`` is a JSON object and the value is of ``kind``, else None: the server's JSON
    is untrusted input (a bool is not an int here)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, bool) and kind is not bool:
        return None
    return value if isinstance(value, kind) else None


def count(value: Any) -> int | None:
    """A count from the server as a transcript may record it (a whole number from 0 to 2^53), else None."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


__all__ = ["RUNNER_UP_TOP", "CallText", "Records", "read_answer", "usage_of", "mean_pooled", "field", "count"]
