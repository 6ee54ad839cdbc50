"""What the machine offers llama.cpp, measured as the engine reads it: the CPUs other work keeps busy
(``CpuShare`` over ``/proc/stat`` less this process's own time) and the generation threads that fit them."""

from __future__ import annotations

import os

from hypothesis import given, strategies as st

from tensorjob_jupyter.inference.topology import CpuShare, busy_seconds, fitting_threads, logical_cpus

HZ = os.sysconf("SC_CLK_TCK")
STAT = """cpu  900 10 300 5000 20 5 5 0 0 0
cpu0 400 5 100 2500 10 2 3 0 0 0
cpu1 500 5 200 2500 10 3 2 1 0 0
intr 12345
"""


def test_busy_time_is_user_nice_system_irq_softirq_and_steal_of_the_cpus_asked_for():
    assert busy_seconds([0], STAT) == (400 + 5 + 100 + 2 + 3 + 0) / HZ
    assert busy_seconds([0, 1], STAT) == (510 + 711) / HZ
    assert busy_seconds([7], STAT) == 0.0  # a CPU the file does not list: nothing counted
    assert busy_seconds([0]) is not None  # this machine's own file reads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_other_work_is_the_cpus_busy_time_less_our_own_per_second_of_a_window():
    clock, busy, own = Clock(), [10.0], [3.0]
    share = CpuShare(2.0, busy=lambda: busy[0], own=lambda: own[0], clock=clock)
    assert share.others() is None  # no window yet
    clock.now += 2.0
    busy[0] += 3.0  # 1.5 cores busy over two seconds...
    own[0] += 1.0  # ...of which half a core was ours
    assert share.others() == 1.0
    assert share.others() is None  # the next window has just begun
    clock.now += 4.0
    own[0] += 1.0  # our own time counted in the busy time: the rest was idle
    busy[0] += 1.0
    assert share.others() == 0.0


def test_a_machine_whose_stat_cannot_be_read_gives_no_verdict():
    clock = Clock()
    share = CpuShare(1.0, busy=lambda: None, own=lambda: 0.0, clock=clock)
    clock.now += 5
    assert share.others() is None


@given(most=st.integers(1, 64), cpus=st.integers(1, 64), others=st.floats(0, 200, allow_nan=False))
def test_the_threads_that_fit_are_at_least_one_and_at_most_the_engines_own(most, cpus, others):
    n = fitting_threads(most, cpus, others)
    assert 1 <= n <= most
    if others <= 0.25 and most <= cpus:
        assert n == most  # a machine to ourselves: every thread the engine has
    if others >= cpus - 0.5:
        assert n == 1  # every CPU taken by others: one thread, which no barrier can hold


def test_both_cores_taken_by_two_spinning_processes_leave_one_thread():
    # as measured with two `python -c "while 1: pass"`: they kept about 1.2 of 2 CPUs beside our two threads
    assert fitting_threads(2, 2, 1.2) == 1
    assert fitting_threads(2, 2, 0.3) == 2
    assert logical_cpus() >= 1
