"""Guests on a shared engine (sandbox/engines.py) keep their own instance, memory, deadline and cancel."""

import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# --- the pooling allocator ------------------------------------------------------------------


def _pooled(guest) -> bool:
    return guest._shared.key[-1] == "pooled"


def _require_pool() -> None:
    """Skip where this process may make no pool (an address-space limit, a small address space): its guests start
    on demand, which the other tests cover."""
    with Guest(FRESH) as probe:
        if not _pooled(probe):
            pytest.skip("this process makes no pool (see engines._reservable)")


def test_guests_start_on_the_pooled_engine_and_past_its_room_on_the_on_demand_one(monkeypatch):
    _require_pool()
    from tensorjob_jupyter.sandbox import engines

    with Guest(FRESH) as probe:
        assert _pooled(probe)
        others = probe._shared.live - 1  # guests other tests of this process left live, if any
    monkeypatch.setattr(engines, "POOL_GUESTS", engines.POOL_MARGIN + others + 2)  # room for two more, then none
    guests = [Guest(FRESH) for _ in range(5)]
    try:
        pooled = [_pooled(g) for g in guests]
        assert pooled == [True, True, False, False, False], pooled
        for g in guests:  # each runs wherever it started, its memory its own
            assert g.init(b"{}").result == "fresh"
    finally:
        for g in guests:
            g.close()
    with Guest(FRESH) as again:  # the room is back once they end
        assert _pooled(again)


def test_a_guest_allowed_more_memory_than_a_slot_runs_on_demand_and_gets_all_of_it():
    _require_pool()
    from tensorjob_jupyter.sandbox import engines

    limit = engines.POOL_MEMORY_BYTES + (64 << 20)
    with Guest(wat.memory_bomb(), tj.Limits(memory_bytes=limit)) as big:
        assert not _pooled(big)
        big.init(b"{}")
        assert engines.POOL_MEMORY_BYTES < big.peak_memory_bytes <= limit
    with Guest(wat.memory_bomb(), tj.Limits(memory_bytes=8 << 20)) as small:
        assert _pooled(small)
        small.init(b"{}")
        assert small.peak_memory_bytes <= 8 << 20


def test_past_its_pools_a_process_starts_guests_of_new_settings_on_demand(monkeypatch):
    """Each set of engine settings has a pool of its own (about a terabyte of address space); past
    ``POOL_ENGINES`` of them, guests of settings not seen before start on the on-demand engine."""
    from tensorjob_jupyter.sandbox import engines

    monkeypatch.setattr(engines, "POOL_ENGINES", 0)
    with Guest(FRESH, tj.Limits(stack_bytes=(1 << 20) + 3 * 65536)) as g:  # settings no other test uses
        assert not _pooled(g)
        assert g.init(b"{}").result == "fresh"


def _marker_guest(offset: int) -> bytes:
    """Grows its memory to hold ``offset``, traps if the byte there is not zero, then sets it: a guest that
    started on a slot another left dirty would trap."""
    pages = offset // 65536 + 1
    return wat.script_guest([{"cmd": "done", "result": "clean"}], init_body=f"""
      (if (i32.lt_u (memory.size) (i32.const {pages}))
        (then (drop (memory.grow (i32.sub (i32.const {pages}) (memory.size))))))
      (if (i32.load8_u (i32.const {offset})) (then (unreachable)))
      (i32.store8 (i32.const {offset}) (i32.const 0xab))
      (call $next)""")


@settings(max_examples=25, deadline=None)
@given(offset=st.one_of(st.integers(0, wat.DATA - 1), st.integers(2 * wat.HEAP, 6 << 20)))
def test_a_pooled_slot_never_shows_a_guest_what_the_one_before_it_wrote(offset):
    """Whatever a guest writes wherever in its memory -- inside the part a warm slot keeps mapped or past it --
    the next guest on that slot starts from zeros there."""
    _require_pool()
    guest = _marker_guest(offset)
    for _ in range(3):
        with Guest(guest) as g:
            assert _pooled(g)
            assert g.init(b"{}").result == "clean"


def test_a_process_held_to_a_few_gigabytes_of_address_space_runs_its_guests_without_the_pool(tmp_path):
    """A pool reserves a 4 GiB range for each of its memory slots when its engine is made; under an address-space
    limit that cannot be done (and wasmtime would end the process), so guests start on the on-demand engine."""
    guest = tmp_path / "fresh.wasm"
    guest.write_bytes(FRESH)
    script = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
import tensorjob_jupyter as tj
from tensorjob_jupyter.sandbox.guest import Guest
with Guest(open({str(guest)!r}, "rb").read()) as g:
    assert g._shared.key[-1] != "pooled", g._shared.key
    assert g.init(b"{{}}").result == "fresh"
env = tj.run({str(guest)!r}, runs_dir={str(tmp_path / "runs")!r})
assert env.ok and env.result == "fresh", env
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "without the pooling allocator" in done.stderr


def test_guests_a_pool_refuses_start_on_demand(tmp_path):
    """A pool full past its room -- its live count racing the guests that start together -- or one whose own
    limits refuse a module (its tables, its instance's size) leaves the guest to the on-demand engine, never fails
    it: here a pool with room for one instance and no margin, three C guests and two Python guests at once."""
    _require_pool()
    guest = tmp_path / "g.py"
    guest.write_text('import tensorjob as tj\ndef main(input):\n    return tj.infer("hi", max_tokens=2).text\n')
    fresh = tmp_path / "fresh.wasm"
    fresh.write_bytes(FRESH)
    script = f"""
from tensorjob_jupyter.sandbox import engines
engines.POOL_GUESTS, engines.POOL_MARGIN = 1, -10  # the live count lets every guest try the pool
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.sandbox.guest import Guest
from tensorjob_jupyter.sandbox.python.guest import PythonGuest
guests = [Guest(open({str(fresh)!r}, "rb").read()) for _ in range(3)]
pooled = [g._shared.key[-1] == "pooled" for g in guests]
assert pooled == [True, False, False], pooled
assert all(g.init(b"{{}}").result == "fresh" for g in guests)
from tensorjob_jupyter.sandbox.python.program import PythonProgram
held = [PythonGuest(PythonProgram(open({str(guest)!r}).read(), "g.py")) for _ in range(2)]
assert [g._shared.key[-1] == "pooled" for g in held] == [True, False]
for g in held:
    g.close()
jobs = [tj.Job({str(guest)!r}, backend=ScriptedBackend("a b"), runs_dir={str(tmp_path / "runs")!r}) for _ in range(2)]
for job in jobs:
    job.start()
for job in jobs:
    env = job.wait(300)
    assert env.ok and env.result == "a b", env
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_module_with_as_many_tables_as_a_store_allows_runs_pooled():
    _require_pool()
    two_tables = wat.script_guest([{"cmd": "done", "result": "two"}], extra="(table 1 funcref) (table 2 funcref)")
    with Guest(two_tables) as g:
        assert _pooled(g)
        assert g.init(b"{}").result == "two"
