"""What a request to a model server fails with: one exception of the kinds the reactor knows, one line, no key.

Every failure of a served request -- refused, unreachable, timed out, busy, a constraint refused, a malformed
stream -- becomes a ``ModelError``, ``ModelTimeout``, ``ServerBusy`` (a ``QueueFull``) or ``ConstraintError``
whose message is one printable line of bounded length (``clip``) quoting at most ``MAX_SERVER_TEXT`` of the
server's own words. The key is scrubbed from every message before it is cut (``scrub_key``): the whole key
and any run of ``KEY_RUN_CHARS`` of it, so no cut leaves part of one behind. Apart from the backend because
what a message may say is a rule of its own, tested on its own.

Design: docs/internals/inference.md#errors-and-the-key
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tensorjob_jupyter.inference.base import ConstraintError, ModelError, ModelTimeout, QueueFull

#: How much of a server's own error text a message quotes.
MAX_SERVER_TEXT = 200
#: A run of this many characters of the key (or the whole key, if shorter) is scrubbed from every message.
KEY_RUN_CHARS = 6


class ServerBusy(QueueFull):
    """The model server said it is overloaded (HTTP 429 or 503): ``busy``."""


class Aborted(Exception):
    """This request was aborted from another thread (a cancel, a timeout of the job)."""


def scrub_key(text: str, key: str, run: int = KEY_RUN_CHARS) -> str:
    """``text`` with the whole of ``key``, and every run of ``run`` or more of its consecutive characters,
    replaced by ``***`` (a key shorter than 4 characters is not looked for)."""
    if not key or len(key) < 4 or not text:
        return text
    text = text.replace(key, "***")
    run = min(run, len(key))
    pieces = {key[i:i + run] for i in range(len(key) - run + 1)}
    spans: list[list[int]] = []  # the runs found, overlapping and touching ones merged
    for i in range(len(text) - run + 1):
        if text[i:i + run] in pieces:
            if spans and i <= spans[-1][1]:
                spans[-1][1] = i + run
            else:
                spans.append([i, i + run])
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], "***"]
        at = end
    return "".join(out) + text[at:]


def clip(text: Any, n: int = MAX_SERVER_TEXT, scrub: Callable[[str], str] | None = None) -> str:
    """``text`` as one printable line of at most ``n`` characters; ``scrub`` (the key's) runs before it is
    cut, so no cut leaves part of a key behind. Bounded work for any length of text."""
    text = " ".join(str(text)[:8 * n + 256].split())
    text = "".join(c for c in text if c.isprintable())
    if scrub is not None:
        text = scrub(text)
    return text if len(text) <= n else text[:n] + "…"


def server_text(e: Any, scrub: Callable[[str], str] | None = None) -> str:
    """What the server said in the error ``e`` (its JSON body's message, or the SDK's), clipped."""
    body = getattr(e, "body", None)
    message = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message is None and isinstance(body.get("detail"), (str, list)):
            message = body["detail"]
    return clip(message if message is not None else getattr(e, "message", "") or "", scrub=scrub)


def classify(e: BaseException, url: str, key_env: str, scrub: Callable[[str], str] | None = None) -> BaseException:
    """A request's exception as one the reactor maps to a code (see the module docstring); ``scrub``
    takes the key out of the server's text before it is clipped."""
    if isinstance(e, (ModelError, QueueFull)):
        return e
    try:
        import httpx2
        import openai
    except ImportError:  # pragma: no cover
        return ModelError(f"{type(e).__name__}: {clip(str(e), scrub=scrub)}")
    cause = e.__cause__ if isinstance(e, openai.APIConnectionError) else e
    if isinstance(cause, (httpx2.ConnectError, httpx2.ConnectTimeout)) or isinstance(e, Aborted):
        why = "it did not answer in time" if isinstance(cause, httpx2.ConnectTimeout) else "connection refused"
        if isinstance(cause, httpx2.ConnectError) and "refused" not in str(cause).lower():
            why = clip(str(cause), 120, scrub) or "cannot connect"
        return ModelError(f"cannot reach the model server at {url}: {why}")
    if isinstance(e, openai.APITimeoutError) or isinstance(cause, httpx2.TimeoutException):
        return ModelTimeout(f"the model server at {url} sent nothing for too long (read_timeout_s)")
    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        said = server_text(e, scrub)
        said = f": {said}" if said else ""
        if status in (429, 503):
            return ServerBusy(f"the model server at {url} is busy (HTTP {status}){said}; try again later")
        if status in (408, 504):
            return ModelTimeout(f"the model server at {url} timed out (HTTP {status}){said}")
        if status in (401, 403):
            return ModelError(f"the model server at {url} refused the key in ${key_env} (HTTP {status}){said}")
        if status in (400, 422) and re.search(r"response_format|json_schema|schema|grammar|regex|structured_output"
                                              r"|guided_|\bchoices?\b", said, re.I):
            return ConstraintError(f"the model server at {url} refused the constraint on the output "
                                   f"(HTTP {status}){said}")
        error = ModelError(f"the model server at {url} answered HTTP {status}{said}")
        error.status = status  # type: ignore[attr-defined]
        return error
    if isinstance(e, openai.APIConnectionError):
        return ModelError(f"the model server at {url} dropped the connection mid-answer"
                          + (f" ({type(cause).__name__})" if cause is not None else ""))
    if isinstance(e, openai.APIError):
        return ModelError(f"the model server at {url} reported an error in its stream: {clip(str(e), scrub=scrub)}")
    if isinstance(e, (ValueError, TypeError, AttributeError, KeyError)):  # bad JSON, a chunk of the wrong shape
        return ModelError(f"the model server's stream is malformed ({type(e).__name__}: {clip(str(e), 120, scrub)})")
    return ModelError(f"the request to the model server at {url} failed: {type(e).__name__}: "
                      f"{clip(str(e), scrub=scrub)}")


__all__ = ["MAX_SERVER_TEXT", "KEY_RUN_CHARS", "ServerBusy", "Aborted", "scrub_key", "clip", "server_text",
           "classify"]
