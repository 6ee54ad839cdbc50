"""Guests on a shared engine (sandbox/engines.py) keep their own instance, memory, deadline and cancel."""

import subprocess
import sys
import threading
import time

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.sandbox.guest import Guest, GuestTrap

import wat

#: cf_init traps if the cell at 0x8000 is already set, else sets it: a second guest that saw the first's
#: memory would trap.
FRESH = wat.script_guest([{"cmd": "done", "result": "fresh"}], init_body="""
  (if (i32.load (i32.const 0x8000)) (then (unreachable)))
  (i32.store (i32.const 0x8000) (i32.const 1))
  (call $next)""")


def test_guests_of_one_module_each_start_with_memory_of_their_own():
    for _ in range(3):
        env = tj.run(FRESH)
        assert env.ok and env.result == "fresh", env
    with Guest(FRESH) as a, Guest(FRESH) as b:  # two live instances of the one prepared module at once
        a.init(b"{}")
        b.init(b"{}")


def test_cancelling_one_spinning_guest_leaves_another_on_the_same_engine_running():
    spin = wat.spin_in_init()
    outcome: dict = {}

    def run(name, guest):
        started = time.monotonic()
        try:
            guest.init(b"{}")
        except GuestTrap as e:
            outcome[name] = (e.code, time.monotonic() - started)

    with Guest(spin, tj.Limits(call_timeout_s=30)) as a, Guest(spin, tj.Limits(call_timeout_s=1.0)) as b:
        threads = [threading.Thread(target=run, args=("a", a)), threading.Thread(target=run, args=("b", b))]
        for t in threads:
            t.start()
        time.sleep(0.2)
        a.interrupt()
        threads[0].join(5)
        assert outcome.get("a", (None,))[0] == codes.CANCELLED
        assert "b" not in outcome  # b spins on: a's cancel was a's alone
        threads[1].join(10)
    code, took = outcome["b"]
    assert code == codes.TIMEOUT and took >= 0.95  # b stopped at its own deadline, not at a's cancel


@pytest.mark.parametrize("memory_bytes", [8 << 20, 16 << 20])
def test_each_guest_on_a_shared_engine_has_its_own_memory_limit(memory_bytes):
    job = tj.Job(wat.memory_bomb(), limits=tj.Limits(memory_bytes=memory_bytes)).start()
    env = job.wait(30)
    assert env.ok and env.result == "survived"
    assert memory_bytes // 2 < job.stats.peak_memory_bytes <= memory_bytes


def test_a_process_that_ran_guests_on_the_shared_engines_exits_cleanly(tmp_path):
    """The engines' prepared linkers hold host functions whose finalizers are Python callbacks; freed in the
    interpreter's teardown they could outlive those callbacks and end the process in SIGSEGV (seen at the end
    of a pytest run of the Python-guest tests). They are dropped at exit while the interpreter is whole."""
    guest = tmp_path / "g.py"
    guest.write_text('import tensorjob as tj\ndef main(input):\n    return tj.infer("hi").text\n')
    script = f"""
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.sandbox import engines
assert tj.run({str(guest)!r}, backend=ScriptedBackend("ok")).ok
assert any(e._prepared for e in engines._ENGINES.values())
engines._release_at_exit()
assert not any(e._prepared for e in engines._ENGINES.values())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_guest_collected_while_another_is_watched_leaves_the_new_one_to_start(monkeypatch):
    """A guest's deadline entry is dropped by its weak reference's callback, which runs wherever the garbage
    collector does -- inside the allocation of the next guest's own entry, say. With a lock around the entries
    that thread waited on itself and the job never started; here the collector is made to run right there."""
    import gc
    import weakref

    from tensorjob_jupyter.sandbox import engines

    class CollectingFirst:
        @staticmethod
        def ref(obj, callback=None):
            gc.collect()  # the collector runs at this allocation, as it may at any
            return weakref.ref(obj, callback)

    ended: list = []

    def start_after_garbage():
        old = Guest(FRESH)
        old.cycle = old  # only the collector frees it
        del old
        with Guest(FRESH) as new:
            new.init(b"{}")
        ended.append(True)

    monkeypatch.setattr(engines, "weakref", CollectingFirst)
    thread = threading.Thread(target=start_after_garbage, daemon=True)
    thread.start()
    thread.join(60)
    assert ended, "the second guest's start hung on the first one's collection"
