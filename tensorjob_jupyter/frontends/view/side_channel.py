"""Let a widget's clicks through while its cell is still running.

While a cell waits for its job the kernel's main thread handles no other shell message, so a click on Cancel
would wait for the job it means to cancel. ipykernel 7.4 can route a comm's messages to a subshell of its own;
the view's comms are pointed at one side subshell and pinned there. This leans on ipykernel internals
(``TESTED_IPYKERNEL``); where routing cannot apply it says so once, and a kernel interrupt still cancels.

Design: docs/internals/frontends.md#viewside_channelpy
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

log = logging.getLogger("tensorjob_jupyter.frontends.view")

#: The ipykernel versions whose internals this module is tested on; pyproject.toml pins the same.
TESTED_IPYKERNEL = ">=7.4,<7.5"

_lock = threading.Lock()
_subshell_ids: dict[int, str] = {}
_pinned_classes: dict[type, type] = {}
warned = False


def _pinned_id(comm) -> str | None:
    return comm.__dict__.get("_tensorjob_side_subshell")


def _ignore(comm, value) -> None:
    """ipykernel points the comm at the sender's subshell on each send: the pin stays."""


def _pin(comm, subshell_id: str) -> None:
    """Route ``comm``'s front-end messages to ``subshell_id`` for good (see the module doc)."""
    cls: type = type(comm)  # its metaclass (type(cls)) makes the pinned subclass
    if getattr(cls, "_tensorjob_pinned", False):
        comm.__dict__["_tensorjob_side_subshell"] = subshell_id
        return
    with _lock:
        pinned = _pinned_classes.get(cls)
        if pinned is None:
            pinned = type(cls)(f"SideChannel{cls.__name__}", (cls,),
                               {"_reply_subshell_id": property(_pinned_id, _ignore), "_tensorjob_pinned": True,
                                "__module__": __name__})
            _pinned_classes[cls] = pinned
    comm.__dict__["_tensorjob_side_subshell"] = subshell_id
    comm.__dict__.pop("_reply_subshell_id", None)
    comm.__class__ = pinned


def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    shell = get_ipython()
    return getattr(shell, "kernel", None)


def _side_subshell(kernel) -> str:
    """One subshell of ``kernel`` for widget clicks, created on first use."""
    with _lock:
        existing = _subshell_ids.get(id(kernel))
        if existing is not None:
            return existing
        thread = kernel.shell_channel_thread
        manager = thread.manager
        created: Future = Future()

        def create() -> None:  # runs on the shell channel thread, as ipykernel requires
            try:
                created.set_result(manager._create_subshell())
            except BaseException as e:  # noqa: BLE001
                created.set_exception(e)

        thread.io_loop.add_callback(create)
        subshell_id = created.result(timeout=5)
        _subshell_ids[id(kernel)] = subshell_id
        return subshell_id


def _cannot_route(reason: str) -> bool:
    """Warn once per process that clicks wait for the cell; always False."""
    global warned
    with _lock:
        first, warned = not warned, True
    if first:
        log.warning("the Cancel button of a live view cannot act while its cell waits (%s); "
                    "run the job with --bg, or interrupt the kernel to cancel it. "
                    "tensorjob-jupyter is tested with ipykernel%s", reason, TESTED_IPYKERNEL)
    return False


def _ipykernel_version() -> str:
    try:
        import ipykernel

        return ipykernel.__version__
    except Exception:  # noqa: BLE001
        return "unknown"


def route_clicks_to_side_thread(widget) -> bool:
    """Make ``widget``'s front-end messages run off the main thread; True if done."""
    try:
        kernel = _kernel()
        if kernel is None:
            return False  # no kernel, no front end: nothing to route, nothing to say
        comm = getattr(widget, "comm", None)
        if comm is None:
            return _cannot_route("the widget has no comm")
        if not getattr(kernel, "_supports_kernel_subshells", False) or not hasattr(comm, "_reply_subshell_for"):
            return _cannot_route(f"ipykernel {_ipykernel_version()} has no comm reply routing to subshells")
        _pin(comm, _side_subshell(kernel))
        return True
    except Exception as e:  # noqa: BLE001 - best effort; the fallbacks are documented above
        return _cannot_route(f"routing failed: {type(e).__name__}: {e}")


__all__ = ["TESTED_IPYKERNEL", "warned", "route_clicks_to_side_thread"]
