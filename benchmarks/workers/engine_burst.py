"""The engine's costs per operation, measured inside one distrun job (whichever tree's ``collectives`` comes
first on ``PYTHONPATH``). Rank 0 prints one JSON line.

* ``burst``: ``--count`` ``allreduce_async_`` of ``--size`` bytes each, named, then ``synchronize`` on each
  (``submitting``: the part of it spent in the ``allreduce_async_`` calls);
  ``grouped``: one ``grouped_allreduce_`` of the same tensors; ``raw``: one ``torch.distributed.all_reduce``
  of a tensor of all their bytes. The three take turns in every round, each after a barrier of the ranks
  and ``--run`` times in a row (a call's time is the run's over ``--run``: 1 for a call's latency alone, more
  for calls back to back); each round's time is the slowest rank's, and the ratios are per round.
* ``--count-calls``: Python function calls per operation of a burst, on every thread of rank 0.
* ``step``: a step's worth of named operations (``--step-count`` ``allreduce_async_`` of ``--step-size``
  bytes, the same names every step, so they are cached after the first), repeated; per step, how many
  agreement rounds ran and the CPU they took beyond their gathers (``Engine._round_locked`` less
  ``Engine._execute`` and the gathers' waits), per operation, the submitting thread's CPU per submission,
  and the time the garbage collector took (on any thread, wherever it fell: a full pass lands in one step
  of several).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import collectives
from collectives import engine, engine_rounds
from collectives.reduce_op import ReduceOp


class Meter:
    """Wraps the engine's round, its issue and its gathers to time the agreement's own CPU."""

    def __init__(self) -> None:
        self.rounds = 0
        self.round_ns = 0
        self.execute_ns = 0
        self.gather_ns = 0

    def install(self) -> None:
        meter = self
        round_locked: Callable[..., Any] = engine.Engine._round_locked
        execute: Callable[..., Any] = engine.Engine._execute
        gather: Callable[..., Any] = engine_rounds._gather

        def timed_round(self: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return round_locked(self)
            finally:
                meter.rounds += 1
                meter.round_ns += time.thread_time_ns() - start

        def timed_execute(self: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return execute(self)
            finally:
                meter.execute_ns += time.thread_time_ns() - start

        def timed_gather(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return gather(*args, **kwargs)
            finally:
                meter.gather_ns += time.thread_time_ns() - start

        engine.Engine._round_locked = timed_round  # type: ignore[method-assign]
        engine.Engine._execute = timed_execute  # type: ignore[method-assign]
        engine_rounds._gather = timed_gather

    def agreement_ns(self) -> int:
        return self.round_ns - self.execute_ns - self.gather_ns


class CollectorClock:
    """Wall time spent in the garbage collector's passes, on every thread."""

    def __init__(self) -> None:
        self.ns = 0
        self._started = 0

    def install(self) -> None:
        gc.callbacks.append(self._event)

    def _event(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._started


def slowest(values: list[float]) -> list[float]:
    out = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out.tolist()


def burst(args: argparse.Namespace) -> dict[str, Any]:
    tensors = [torch.zeros(args.size // 4) for _ in range(args.count)]
    whole = torch.zeros(args.count * args.size // 4)
    names = [f"bench.burst.{i}" for i in range(args.count)]

    submitting = [0.0]  # the bursts' submissions of this round so far, s

    def many() -> None:
        pairs = zip(tensors, names, strict=True)
        start = time.perf_counter()
        handles = [collectives.allreduce_async_(t, name=n, op=ReduceOp.SUM) for t, n in pairs]
        submitting[0] += time.perf_counter() - start
        for handle in handles:
            collectives.synchronize(handle)

    cases: dict[str, Callable[[], object]] = {
        "burst": many,
        "grouped": lambda: collectives.grouped_allreduce_(tensors, op=ReduceOp.SUM),
        "raw": lambda: dist.all_reduce(whole),
    }
    for case in cases.values():
        for _ in range(3):
            case()
    times: dict[str, list[float]] = {name: [] for name in [*cases, "submitting"]}
    order = list(cases)
    shuffler = random.Random(7)  # the same order on every rank
    collectives.barrier()
    for _ in range(args.rounds):
        shuffler.shuffle(order)
        submitting[0] = 0.0
        for name in order:
            # Every case starts with the ranks in step: its time is its own, not the last case's skew.
            dist.barrier()
            case = cases[name]
            start = time.perf_counter()
            for _ in range(args.run):
                case()
            times[name].append((time.perf_counter() - start) / args.run)
        times["submitting"].append(submitting[0] / args.run)
    return {name: slowest(values) for name, values in times.items()}


class CallCounter:
    """Counts Python function calls on every thread started after :meth:`install` (the engine's too) and on
    this one, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.calls = 0

    def install(self) -> None:
        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and self.on:
                self.calls += 1

        threading.setprofile(profile)
        sys.setprofile(profile)


def python_calls(args: argparse.Namespace, counter: CallCounter) -> float:
    """Python function calls per operation of one burst of named async allreduces, on every thread."""
    tensors = [torch.zeros(args.size // 4) for _ in range(args.count)]
    names = [f"bench.calls.{i}" for i in range(args.count)]
    for counting in (False, True, True):  # the first burst fills the caches
        collectives.barrier()
        counter.on = counting
        pairs = zip(tensors, names, strict=True)
        handles = [collectives.allreduce_async_(t, name=n, op=ReduceOp.SUM) for t, n in pairs]
        for handle in handles:
            collectives.synchronize(handle)
        counter.on = False
    return counter.calls / 2 / args.count


def steps(args: argparse.Namespace, meter: Meter, collector: CollectorClock) -> dict[str, Any]:
    tensors = [torch.zeros(max(1, args.step_size // 4)) for _ in range(args.step_count)]
    names = [f"bench.step.{i}" for i in range(args.step_count)]

    def step() -> int:
        """Runs one step; the submitting thread's CPU for its submissions, ns."""
        pairs = zip(tensors, names, strict=True)
        start = time.thread_time_ns()
        handles = [collectives.allreduce_async_(t, name=n, op=ReduceOp.SUM) for t, n in pairs]
        submitted = time.thread_time_ns() - start
        for handle in handles:
            collectives.synchronize(handle)
        return submitted

    for _ in range(3):
        step()
    collectives.barrier()
    seconds, rounds, agreement, collecting, submitting = [], [], [], [], []
    for _ in range(args.steps):
        r0, a0, c0 = meter.rounds, meter.agreement_ns(), collector.ns
        start = time.perf_counter()
        submitting.append(step() / args.step_count)
        seconds.append(time.perf_counter() - start)
        rounds.append(meter.rounds - r0)
        agreement.append((meter.agreement_ns() - a0) / args.step_count)
        collecting.append((collector.ns - c0) / 1e9)
    return {
        "seconds": slowest(seconds),
        "rounds": rounds,
        "agreement_ns_per_op": agreement,
        "collector_seconds": collecting,
        "submit_ns_per_op": submitting,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--run", type=int, default=1, help="calls of a case in a row, timed together")
    parser.add_argument("--step-count", type=int, default=1000)
    parser.add_argument("--step-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=0, help="steps of --step-count operations (0: none)")
    parser.add_argument("--count-calls", action="store_true", help="only count Python calls per operation")
    args = parser.parse_args()
    counter = CallCounter()
    if args.count_calls:
        counter.install()
    meter = Meter()
    meter.install()
    collector = CollectorClock()
    collector.install()
    collectives.init()
    out: dict[str, Any] = {"world": collectives.size()}
    if args.count_calls:
        out["python_calls_per_op"] = python_calls(args, counter)
    elif args.rounds:
        out["burst"] = burst(args)
    if args.steps:
        out["steps"] = steps(args, meter, collector)
    if collectives.rank() == 0:
        print(json.dumps(out), flush=True)
    collectives.shutdown()


if __name__ == "__main__":
    main()
