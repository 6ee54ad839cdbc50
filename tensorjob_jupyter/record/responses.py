"""Each ``infer`` as one response in the Open Responses event format.

An infer publishes ``response.created``, its output item, one ``response.output_text.delta`` per
token (a ``function_call`` item when the model calls a tool), and exactly one terminal event:
``response.completed``, ``response.incomplete`` or ``error`` then ``response.failed``. The schema
of record is the openai SDK's ``ResponseStreamEvent`` (the tests validate every event against
it), so the spec's shape and closed vocabularies are kept, and this project's own fields
(``finish_reason``, the ``sampler``, a token's ``runner_up_logprob``, the guest's ``command`` for
replay, ``timing``) go beside them. ``busy_machine_line`` reads a terminal event's timing for the
front ends.

Design: docs/internals/record.md#responsespy
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TypeGuard

from tensorjob_jupyter.abi import event_types
from tensorjob_jupyter.record.events import EventStream


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseStream:
    """Publishes one infer's Open Responses events on a job's stream."""

    def __init__(self, stream: EventStream, *, model: str, max_output_tokens: int,
                 temperature: float | None = None, top_p: float | None = None, index: int = 0,
                 output: dict | None = None, sampler: dict | None = None, call_id: str | None = None,
                 top_logprobs: int = 0):
        self.stream = stream
        self.id = _id("resp")
        self.item_id = _id("msg")
        self.model = model
        self.index = index
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.top_p = top_p
        #: ``text``, ``tools`` and ``tool_choice`` as the response object reports them.
        self.output = output or {"text": {"format": {"type": "text"}}, "tools": [], "tool_choice": "none"}
        self.sampler = sampler
        self.created_at = int(time.time())
        self.text_parts: list[str] = []
        self.top_logprobs = top_logprobs
        #: every delta's token records, in order (``output_text.done`` and the part's ``logprobs``)
        self.logprobs: list[dict] = []
        self._opened = False
        # a function_call item, once the model has named the function
        self.call_name: str | None = None
        self.call_id: str | None = None
        self._given_call_id = call_id  # the id a function call gets, when it is not to be a new one
        self.call_item_id: str | None = None
        self.call_parts: list[str] = []

    @property
    def call_open(self) -> bool:
        return self.call_name is not None

    # -- snapshots ------------------------------------------------------------------

    def _part(self, text: str, logprobs: list[dict] | None = None) -> dict:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        return part

    def _item(self, status: str, text: str | None) -> dict:
        content = [] if text is None else [self._part(text)]  # a snapshot: the records are in the part events
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": content}

    def _resource(self, status: str, *, output: list | None = None, usage: dict | None = None,
                  error: dict | None = None, incomplete: dict | None = None,
                  completed_at: int | None = None) -> dict:
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "completed_at": completed_at, "status": status, "incomplete_details": incomplete,
            "model": self.model, "previous_response_id": None, "instructions": None,
            "output": output or [], "error": error, "tools": self.output["tools"],
            "tool_choice": self.output["tool_choice"], "truncation": "disabled", "parallel_tool_calls": False,
            "text": self.output["text"], "top_p": self.top_p,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": self.top_logprobs,
            "temperature": self.temperature, "reasoning": None, "usage": usage,
            "max_output_tokens": self.max_output_tokens, "max_tool_calls": None,
            "store": False, "background": False, "service_tier": "default", "metadata": {},
            "safety_identifier": None, "prompt_cache_key": None,
            **({"sampler": self.sampler} if self.sampler is not None else {}),
            # this project's extension: the regex, choices or Lark grammar the answer was held to
            **{k: self.output[k] for k in ("regex", "choices", "grammar") if k in self.output},
        }

    def _call_item(self, status: str, arguments: str) -> dict:
        return {"type": "function_call", "id": self.call_item_id, "call_id": self.call_id, "name": self.call_name,
                "arguments": arguments, "status": status}

    @staticmethod
    def usage_json(input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
        """Usage in the spec's shape; the prompt tokens not read from the KV cache were written to it."""
        return {"input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": cached_tokens,
                                         "cache_write_tokens": max(0, input_tokens - cached_tokens)},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens}

    # -- the sequence ---------------------------------------------------------------

    def start(self, **extra: Any) -> None:
        """``response.created`` (with ``extra`` fields beside the spec's, e.g. the guest's
        ``command``, which replay relies on) and ``response.in_progress``."""
        self.stream.publish(event_types.RESPONSE_CREATED, response=self._resource("queued"), infer_index=self.index,
                            **extra)
        self.stream.publish(event_types.RESPONSE_IN_PROGRESS, response=self._resource("in_progress"),
                            infer_index=self.index)

    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        self.stream.publish(event_types.RESPONSE_OUTPUT_ITEM_ADDED, output_index=0,
                            item=self._item("in_progress", None))
        self.stream.publish(event_types.RESPONSE_CONTENT_PART_ADDED, item_id=self.item_id, output_index=0,
                            content_index=0, part=self._part("", []))

    def delta(self, text: str, logprobs: list[dict] | None = None) -> None:
        """One piece of the message, with the records of the tokens it was made of (JSON: see the module doc)."""
        self._open()
        self.text_parts.append(text)
        logprobs = logprobs or []
        self.logprobs.extend(logprobs)
        self.stream.publish(event_types.RESPONSE_OUTPUT_TEXT_DELTA, item_id=self.item_id, output_index=0,
                            content_index=0, delta=text, logprobs=logprobs)

    # -- a function call ------------------------------------------------------------

    def open_call(self, name: str, call_id: str | None = None) -> None:
        """The model has named the function it calls: the ``function_call`` item begins."""
        if self.call_open:
            return
        self.call_name = name
        self.call_id = call_id or self._given_call_id or f"call_{uuid.uuid4().hex[:24]}"
        self.call_item_id = _id("fc")
        self.stream.publish(event_types.RESPONSE_OUTPUT_ITEM_ADDED, output_index=0, item=self._call_item("in_progress", ""))

    def call_delta(self, delta: str) -> None:
        self.call_parts.append(delta)
        self.stream.publish(event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA, item_id=self.call_item_id, output_index=0,
                            delta=delta)

    def _close_call(self, arguments: str, status: str) -> dict:
        self.stream.publish(event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DONE, item_id=self.call_item_id, output_index=0,
                            arguments=arguments)
        item = self._call_item(status, arguments)
        self.stream.publish(event_types.RESPONSE_OUTPUT_ITEM_DONE, output_index=0, item=item)
        return item

    def _close_item(self, text: str, status: str) -> dict:
        if self.call_open:
            return self._close_call("".join(self.call_parts), status)
        self._open()
        self.stream.publish(event_types.RESPONSE_OUTPUT_TEXT_DONE, item_id=self.item_id, output_index=0,
                            content_index=0, text=text, logprobs=self.logprobs)
        self.stream.publish(event_types.RESPONSE_CONTENT_PART_DONE, item_id=self.item_id, output_index=0,
                            content_index=0, part=self._part(text, self.logprobs))
        item = self._item(status, text)
        self.stream.publish(event_types.RESPONSE_OUTPUT_ITEM_DONE, output_index=0, item=item)
        return item

    def finish(self, text: str, *, usage: dict, reason: str, extra: dict[str, Any] | None = None) -> None:
        """Close the response. ``reason``: ``stop`` or ``guest_stop`` (completed),
        ``length`` (incomplete: max_output_tokens) or ``cancelled``."""
        if reason == "length":
            status, item_status, incomplete = "incomplete", "incomplete", {"reason": "max_output_tokens"}
        elif reason == "cancelled":
            status, item_status, incomplete = "cancelled", "incomplete", None
        else:
            status, item_status, incomplete = "completed", "completed", None
        item = self._close_item(text, item_status)
        resource = self._resource(status, output=[item], usage=usage, completed_at=int(time.time()),
                                  incomplete=incomplete)
        resource["output_text"] = "" if self.call_open else text
        self.stream.publish(event_types.RESPONSE_COMPLETED if status == "completed" else event_types.RESPONSE_INCOMPLETE,
                            response=resource, finish_reason=reason, **(extra or {}))

    def fail(self, message: str, *, code: str | None = None, error_type: str = "model_error") -> None:
        """The model failed: an ``error`` event (with this project's code), then ``response.failed``."""
        self.stream.publish(event_types.ERROR, code=code, message=message, param=None, error_type=error_type)
        if self.call_open:
            output = [self._call_item("incomplete", "".join(self.call_parts))]
        else:
            output = [self._item("incomplete", "".join(self.text_parts))] if self._opened else []
        spec_code = "rate_limit_exceeded" if error_type == "too_many_requests" else "server_error"
        self.stream.publish(event_types.RESPONSE_FAILED, finish_reason="error",
                            response=self._resource("failed", output=output,
                                                    error={"code": spec_code, "message": message}))


def _thread_count(n: Any) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and 0 < n < 1 << 16


def _rate(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e7  # NaN compares False


#: A response decoded at less than this share of the model's quiet rate was slowed by other work.
SLOW_SHARE = 0.6


def busy_machine_line(event: dict) -> str | None:
    """The line a front end shows for a finished response that other work slowed: its model decoded it with fewer
    threads than its own (``timing.threads`` below ``timing.own_threads``: fitted to a machine other work keeps
    busy), or at less than ``SLOW_SHARE`` of the tokens a second it decodes at on a quiet machine
    (``timing.quiet_tokens_per_second``); None otherwise, or where the recorded numbers are not plausible ones."""
    timing = event.get("timing")
    if not isinstance(timing, dict):
        return None
    parts = []
    threads, own = timing.get("threads"), timing.get("own_threads")
    if _thread_count(threads) and _thread_count(own) and threads < own:
        parts.append(f"decoded with {threads} of the model's {own} threads")
    rate, quiet = timing.get("tokens_per_second"), timing.get("quiet_tokens_per_second")
    if _rate(rate) and _rate(quiet) and rate < SLOW_SHARE * quiet:
        parts.append(f"{rate:.1f} tokens/s against the model's {quiet:.1f} on a quiet machine")
    if not parts:
        return None
    return f"the machine is busy: {', '.join(parts)} (other work takes the CPUs)"


__all__ = ["ResponseStream", "busy_machine_line"]
