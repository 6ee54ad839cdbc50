"""Let a widget's clicks through while its cell is still running.

A ``%%tensorjob`` cell waits for its job by default, and while a cell runs
the kernel's main thread handles no other shell message -- so a click on the
view's Cancel button would wait for the job it means to cancel. ipykernel 7
can run shell messages on *subshells*, threads of their own, and routes the
front end's replies for a comm to the subshell named by the comm's
``_reply_subshell_id``. We create one such subshell per kernel and point the
Cancel button's comm at it, so its click handler (which only sets a flag and
interrupts the guest) runs at once on that thread.

This leans on ipykernel internals; every step is guarded, and where it does
not apply (an older or newer kernel, no kernel at all) the button still
works whenever the cell is not waiting (``--bg``), and interrupting the
kernel always cancels a waiting job.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

_lock = threading.Lock()
_subshell_ids: dict[int, str] = {}


def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    shell = get_ipython()
    return getattr(shell, "kernel", None)


def _side_subshell(kernel) -> str | None:
    """One subshell of ``kernel`` for widget clicks, created on first use."""
    with _lock:
        existing = _subshell_ids.get(id(kernel))
        if existing is not None:
            return existing
        if not getattr(kernel, "_supports_kernel_subshells", False):
            return None
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


def route_clicks_to_side_thread(widget) -> bool:
    """Make ``widget``'s front-end messages run off the main thread; True if done."""
    try:
        kernel = _kernel()
        if kernel is None:
            return False
        subshell_id = _side_subshell(kernel)
        comm = getattr(widget, "comm", None)
        if subshell_id is None or comm is None or not hasattr(comm, "_reply_subshell_for"):
            return False
        comm._reply_subshell_id = subshell_id
        return True
    except Exception:  # noqa: BLE001 - best effort; the fallbacks are documented above
        return False
