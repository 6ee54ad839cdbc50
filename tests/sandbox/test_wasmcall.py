"""``wasmcall.HotCall`` behaves exactly as wasmtime-py's public ``Func.__call__``.

The host calls the ABI's exports through the C API directly, for speed; this
is the fence around that: results, traps and their codes, epoch interrupts,
fuel, stack overflow, and an exception left by a host function, each compared
with the public API on the same module.
"""

import ctypes
import threading

import pytest
import wasmtime

from tensorjob_jupyter.sandbox.wasmcall import HotCall, HotMemory, set_deadline

MODULE = """(module
  (import "host" "boom" (func $boom (result i32)))
  (memory (export "memory") 1)
  (func (export "add") (param i32 i32) (result i32) (i32.add (local.get 0) (local.get 1)))
  (func (export "neg") (param i32) (result i32) (i32.sub (i32.const 0) (local.get 0)))
  (func (export "trap") (param i32 i32) (result i32) unreachable)
  (func (export "div") (param i32 i32) (result i32) (i32.div_s (local.get 0) (local.get 1)))
  (func (export "spin") (param i32 i32) (result i32) (loop $l (br $l)) (i32.const 0))
  (func $down (export "down") (param i32) (result i32) (call $down (i32.add (local.get 0) (i32.const 1))))
  (func (export "host") (param i32 i32) (result i32) (call $boom))
  (func (export "store") (param i32 i32) (result i32)
    (i32.store (local.get 0) (local.get 1)) (i32.load (local.get 0))))
"""


class HostBoom(Exception):
    pass


def instance(*, fuel=None):
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = fuel is not None
    engine = wasmtime.Engine(cfg)
    store = wasmtime.Store(engine)
    if fuel is not None:
        store.set_fuel(fuel)
    linker = wasmtime.Linker(engine)

    def boom():
        raise HostBoom("from the host")

    linker.define_func("host", "boom", wasmtime.FuncType([], [wasmtime.ValType.i32()]), boom)
    inst = linker.instantiate(store, wasmtime.Module(engine, wasmtime.wat2wasm(MODULE)))
    store.set_epoch_deadline(1000)
    return engine, store, inst.exports(store)


def outcome(call):
    try:
        return ("ok", call())
    except wasmtime.Trap as e:
        return ("trap", e.trap_code)
    except HostBoom as e:
        return ("host", str(e))


@pytest.mark.parametrize("name, args", [
    ("add", (2, 40)), ("add", (2**31 - 1, 1)), ("add", (-5, 3)), ("neg", (7,)), ("neg", (-(2**31),)),
    ("trap", (0, 0)), ("div", (1, 0)), ("div", (-(2**31), -1)), ("down", (0,)), ("host", (0, 0)),
    ("store", (16, 123456)), ("store", (65536, 1)),
])
def test_a_hot_call_does_what_the_public_call_does(name, args):
    _, store, ex = instance()
    public = outcome(lambda: ex[name](store, *args))
    _, store2, ex2 = instance()
    hot = outcome(lambda: HotCall(store2, ex2[name], len(args))(*args))
    assert hot == public


@pytest.mark.parametrize("grow", [0, 1, 15])
def test_a_hot_memory_reads_what_the_public_memory_reads(grow):
    _, store, ex = instance()
    memory = ex["memory"]
    memory.grow(store, grow)
    hot = HotMemory(store, memory)
    assert hot.size() == memory.data_len(store) == (1 + grow) * 65536
    assert hot.base() == ctypes.addressof(memory.data_ptr(store).contents)
    HotCall(store, ex["store"], 2)(hot.size() - 4, 0x01020304)
    assert ctypes.string_at(hot.base() + hot.size() - 4, 4) == bytes(memory.read(store, hot.size() - 4))


def test_an_epoch_interrupt_stops_a_hot_call_as_it_stops_a_public_one():
    engine, store, ex = instance()
    spin = HotCall(store, ex["spin"], 2)
    set_deadline(store, 1)
    ticker = threading.Timer(0.05, engine.increment_epoch)
    ticker.start()
    with pytest.raises(wasmtime.Trap) as info:
        spin(0, 0)
    assert info.value.trap_code == wasmtime.TrapCode.INTERRUPT
    ticker.join()


def test_fuel_runs_out_the_same_way():
    _, store, ex = instance(fuel=10_000)
    with pytest.raises(wasmtime.Trap) as info:
        HotCall(store, ex["spin"], 2)(0, 0)
    assert info.value.trap_code == wasmtime.TrapCode.OUT_OF_FUEL


def test_the_signature_is_checked_up_front():
    _, store, ex = instance()
    with pytest.raises(TypeError):
        HotCall(store, ex["neg"], 2)
    with pytest.raises(TypeError):
        HotCall(store, ex["add"], 1)


def test_a_hot_call_is_reusable_after_a_trap():
    _, store, ex = instance()
    add, trap = HotCall(store, ex["add"], 2), HotCall(store, ex["trap"], 2)
    for _ in range(3):
        with pytest.raises(wasmtime.Trap):
            trap(1, 2)
        assert add(20, 22) == 42
