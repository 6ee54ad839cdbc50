"""Benchmarks of the notebook path: view refresh traffic and lag, and cell start-up.

1. **View refresh.** A job streams tokens as fast as the scripted engine can
   produce them (no model in the way, so the view is under the most pressure
   it can get). We count the widget messages the live view sends (every
   ``Widget._send`` is one comm message to the front end) and compare them with
   the naive design that updates the token widget once per token -- the
   baseline measured in the same run. For lag, a subscriber timestamps each
   token as it is published and the view records when each push went out and
   how many tokens it showed; a token's lag is the time from its publication
   to the first push that showed it. Goal: at most 20 messages a second, and
   no token lags by more than 100 ms plus one refresh period.
2. **Cell start-up.** ``%%tensorjob`` on an unchanged C cell, run again in an
   IPython shell with the model already loaded: the time from the cell's start
   to the guest's first command, against the first (cold) run of the same
   cell, which compiles the guest with zig cc.

Run: ``python bench/bench_view.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import ipywidgets  # noqa: E402

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.frontends.view.widget import JobView

import wat  # noqa: E402


class MessageCounter:
    """Counts comm messages sent by every widget (Widget._send)."""

    def __init__(self):
        self.times: list[float] = []
        self._orig = ipywidgets.Widget._send

    def __enter__(self):
        counter = self

        def counting_send(widget, msg, buffers=None):
            counter.times.append(time.monotonic())
            return counter._orig(widget, msg, buffers)

        ipywidgets.Widget._send = counting_send
        return self

    def __exit__(self, *exc):
        ipywidgets.Widget._send = self._orig


def bench_refresh(tokens: int, refresh_hz: float, token_delay_s: float) -> dict:
    backend = ScriptedBackend(" ".join(f"t{i}" for i in range(tokens)), token_delay_s=token_delay_s)
    guest = wat.script_guest([{"cmd": "infer", "prompt": "go", "max_tokens": tokens}, {"cmd": "done", "result": 1}])
    job = tj.Job(guest, backend=backend)
    published: list[float] = []
    pushes: list[tuple[float, int]] = []

    def watch():
        for event in job.subscribe():
            if event["type"] == "response.output_text.delta":
                published.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    with MessageCounter() as counter:
        view = JobView(job, refresh_hz=refresh_hz)
        original_push = view._push

        def recording_push(dirty):
            sent = original_push(dirty)
            pushes.append((time.monotonic(), view.state.tokens))
            return sent

        view._push = recording_push
        watcher.start()
        view.start()
        start = time.monotonic()
        job.start().wait(300)
        view.join(30)
        watcher.join(30)
    stream_start, stream_end = published[0], published[-1]
    streaming = max(stream_end - stream_start, 1e-9)
    during = [t for t in counter.times if stream_start <= t <= stream_end]
    lags = []
    j = 0
    for k, t_pub in enumerate(published, start=1):
        while j < len(pushes) and pushes[j][1] < k:
            j += 1
        if j < len(pushes):
            lags.append(pushes[j][0] - t_pub)
    return {
        "tokens": tokens,
        "streaming_s": streaming,
        "model_tokens_per_s": (len(published) - 1) / streaming,
        "view_messages_per_s": len(during) / streaming,
        "naive_messages_per_s": (len(published) - 1) / streaming,  # one HTML update per token
        "max_lag_ms": 1000 * max(lags),
        "p50_lag_ms": 1000 * statistics.median(lags),
        "refresh_ms": 1000 / refresh_hz,
        "total_s": time.monotonic() - start,
    }


def bench_cell_startup(repeats: int, use_model: bool) -> dict:
    from IPython.testing.globalipapp import start_ipython

    from tensorjob_jupyter.host import reactor as runner

    ip = start_ipython()
    ip.run_line_magic("load_ext", "tensorjob_jupyter")
    first_command: list[float] = []
    original = runner.Reactor.carry_out

    def timed_execute(self, command):
        if self.stats.steps == 1 and not first_command:
            first_command.append(time.perf_counter())
        return original(self, command)

    runner.Reactor.carry_out = timed_execute
    infer = 'return tj_infer(TJ_STR("Hello"), 4);' if use_model else 'return tj_done(tj_jsonf("\\"ok\\""));'
    cell = f"""// bench cell {time.time()} (new for this run, so the first run compiles)
#include "tensorjob.h"
tj_cmd guest_init(tj_json input) {{ return tj_progress(0, 1); }}
tj_cmd guest_step(tj_event ev) {{
    if (ev.type == TJ_EV_EMITTED) {{ {infer} }}
    return tj_done(tj_jsonf("\\"ok\\""));
}}
"""
    timings = []
    try:
        for _ in range(repeats + 1):
            first_command.clear()
            t0 = time.perf_counter()
            ip.run_cell_magic("tensorjob", "--quiet", cell)
            timings.append(first_command[0] - t0)
    finally:
        runner.Reactor.carry_out = original
    cold, warm = timings[0], statistics.median(timings[1:])
    return {"cold_ms": 1000 * cold, "warm_ms": 1000 * warm, "warm_over_cold": warm / cold, "model": use_model}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-model", action="store_true", help="skip the real model in the start-up benchmark")
    args = parser.parse_args()
    tokens = 2000 if args.quick else 10000
    refresh = bench_refresh(tokens, refresh_hz=10, token_delay_s=0.0)
    paced = bench_refresh(300 if args.quick else 1000, refresh_hz=10, token_delay_s=0.005)
    print("View refresh while a job streams at full speed (refresh_hz=10)")
    for label, r in (("full speed", refresh), ("200 tok/s", paced)):
        print(f"  {label:>10}: model {r['model_tokens_per_s']:8.0f} tok/s | view {r['view_messages_per_s']:5.1f} msg/s "
              f"vs naive {r['naive_messages_per_s']:8.0f} msg/s -> ratio {r['view_messages_per_s'] / r['naive_messages_per_s']:.4f} "
              f"| lag p50 {r['p50_lag_ms']:.0f} ms, max {r['max_lag_ms']:.0f} ms (bound {100 + r['refresh_ms']:.0f} ms)")
    use_model = not args.no_model
    try:
        startup = bench_cell_startup(3 if args.quick else 5, use_model)
    except Exception as e:  # noqa: BLE001 - e.g. no model installed
        print(f"  (model unavailable: {e}; timing without it)")
        startup = bench_cell_startup(3 if args.quick else 5, False)
    print("Cell start to the guest's first command (%%tensorjob, unchanged cell)")
    print(f"  cold (compile) {startup['cold_ms']:.1f} ms | second run {startup['warm_ms']:.1f} ms "
          f"-> ratio {startup['warm_over_cold']:.3f}")
    print(json.dumps({"refresh_full_speed": refresh, "refresh_paced": paced, "cell_startup": startup}))


if __name__ == "__main__":
    main()
