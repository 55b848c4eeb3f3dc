"""Allreduce bandwidth sweep: collectives vs raw torch.distributed, side by side in one run.

Run it under distrun (``distrun -np 2 python -m collectives.bench``). For each message size it reports the
median time per call of:

* ``raw sum``: ``torch.distributed.all_reduce(t)`` and ``coll sum``: ``collectives.allreduce_(t, op=Sum)``;
* ``raw avg``: ``all_reduce(t)`` then ``t.div_(n)`` and ``coll avg``: ``collectives.allreduce_(t)``;
* ``coll avg out``: ``collectives.allreduce(t)`` (out of place, so it includes the copy it returns);
* ``raw sum again``: ``all_reduce(t)`` once more, a control whose ratio to ``raw sum`` is the noise floor.

Then, for ``--many`` tensors of ``--many-size`` each (64 of 1 KB by default), the time to reduce them all:
``64 async`` submits ``allreduce_async_`` for each and then synchronizes every handle (the engine fuses them),
``grouped`` is one ``grouped_allreduce_`` of the same tensors, ``64 raw`` is one ``all_reduce`` per tensor.

The methods take turns call by call, so machine noise lands on all of them alike. Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, the rate each link really carries in a ring
allreduce, comparable across world sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

import collectives
from collectives.reduce_op import ReduceOp

__all__ = ["Row", "bus_bandwidth", "main", "parse_size", "sweep", "sweep_many"]

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M,256M"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"4K"`` -> 4096, ``"256M"`` -> 268435456 (binary units, as nccl-tests)."""
    stripped = text.strip().upper().removesuffix("B")
    unit = stripped[-1] if stripped and stripped[-1] in _UNITS else ""
    number = stripped[: len(stripped) - len(unit)]
    return int(float(number) * _UNITS[unit])


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce: algbw * 2(n-1)/n."""
    return algbw * 2 * (world - 1) / world


# (baseline, contender) pairs compared in the printed tables.
PAIRS = (
    ("raw sum", "coll sum"),
    ("raw avg", "coll avg"),
    ("raw avg", "coll avg out"),
    ("raw sum", "raw sum again"),
)


@dataclasses.dataclass(frozen=True)
class Row:
    """Median seconds per allreduce of ``nbytes`` for each method, and paired time ratios.

    ``ratios["contender/baseline"]`` is the median over rounds of the two methods' time ratio within the same
    round: adjacent calls see the same machine state, so this cancels the drift that ratios of medians keep.
    """

    nbytes: int
    seconds: dict[str, float]
    ratios: dict[str, float]


def _methods(world: int) -> dict[str, Callable[[torch.Tensor], object]]:
    def raw_sum(t: torch.Tensor) -> object:
        return dist.all_reduce(t)

    def raw_avg(t: torch.Tensor) -> object:
        dist.all_reduce(t)
        return t.div_(world)

    return {
        "raw sum": raw_sum,
        # The same call under a second name: its ratio to "raw sum" is the noise floor of the measurement.
        "raw sum again": raw_sum,
        "coll sum": lambda t: collectives.allreduce_(t, op=ReduceOp.SUM),
        "raw avg": raw_avg,
        "coll avg": collectives.allreduce_,
        "coll avg out": collectives.allreduce,
    }


def _timed(fn: Callable[[torch.Tensor], object], tensor: torch.Tensor) -> float:
    if tensor.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(tensor)
    if tensor.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def sweep(sizes: Sequence[int], min_rounds: int, target_s: float, device: torch.device) -> list[Row]:
    """Median seconds per call of every method at every size.

    The methods take turns call by call, in a random order per round, so that machine noise (other
    processes, CPU frequency) lands on all of them alike; there are at least ``min_rounds`` rounds, more
    for small sizes until each method has run for about ``target_s``. Each call's time is the slowest rank's.
    """
    world = collectives.size()
    methods = _methods(world)
    names = list(methods)
    rows = []
    for nbytes in sizes:
        # Zeros stay zeros under sum and average, so repeated in-place reductions never overflow.
        tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for name in names:  # warm-up: connections, allocator, caches
            _timed(methods[name], tensor)
        probe = torch.tensor([_timed(methods["raw sum"], tensor)], dtype=torch.float64, device=device)
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # every rank must run the same number of rounds
        rounds = max(min_rounds, min(2000, round(target_s / max(float(probe.item()), 1e-6))))
        times = torch.zeros((len(names), rounds), dtype=torch.float64)
        collectives.barrier()
        # A fresh order every round, the same on every rank (shared seed): a call is affected by the one
        # before it (the out-of-place method frees a large buffer), so no method may always follow another.
        shuffler = random.Random(nbytes)
        order = list(range(len(names)))
        for r in range(rounds):
            shuffler.shuffle(order)
            for i in order:
                times[i, r] = _timed(methods[names[i]], tensor)
        slowest = times.to(device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        per_call = slowest.cpu()
        medians = per_call.median(dim=1).values
        ratios = {
            f"{contender}/{baseline}": float(
                (per_call[names.index(contender)] / per_call[names.index(baseline)]).median()
            )
            for baseline, contender in PAIRS
        }
        rows.append(Row(nbytes, {name: float(medians[i]) for i, name in enumerate(names)}, ratios))
    return rows


def _many_methods(count: int) -> dict[str, Callable[[list[torch.Tensor]], object]]:
    def raw(tensors: list[torch.Tensor]) -> object:
        for t in tensors:
            dist.all_reduce(t)
        return tensors

    def many_async(tensors: list[torch.Tensor]) -> object:
        handles = [
            collectives.allreduce_async_(t, name=f"bench.many.{i}", op=ReduceOp.SUM)
            for i, t in enumerate(tensors)
        ]
        return [collectives.synchronize(h) for h in handles]

    return {
        f"{count} raw": raw,
        "grouped": lambda tensors: collectives.grouped_allreduce_(tensors, op=ReduceOp.SUM),
        f"{count} async": many_async,
    }


def sweep_many(count: int, nbytes: int, rounds: int, device: torch.device) -> Row:
    """Median seconds to reduce ``count`` tensors of ``nbytes`` each, per method, interleaved as in
    :func:`sweep`; ``nbytes`` in the row is the total."""
    methods = _many_methods(count)
    names = list(methods)
    tensors = [torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device) for _ in range(count)]

    def timed(fn: Callable[[list[torch.Tensor]], object]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(tensors)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for name in names:
        timed(methods[name])
    times = torch.zeros((len(names), rounds), dtype=torch.float64)
    collectives.barrier()
    shuffler = random.Random(count)
    order = list(range(len(names)))
    for r in range(rounds):
        shuffler.shuffle(order)
        for i in order:
            times[i, r] = timed(methods[names[i]])
    slowest = times.to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_call = slowest.cpu()
    medians = per_call.median(dim=1).values
    ratios = {
        f"{contender}/grouped": float((per_call[names.index(contender)] / per_call[1]).median())
        for contender in names
        if contender != "grouped"
    }
    return Row(count * nbytes, {name: float(medians[i]) for i, name in enumerate(names)}, ratios)


def _human(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}B"
    return f"{nbytes}B"


def format_table(rows: Sequence[Row], world: int, baseline: str, contender: str) -> str:
    """One table comparing ``contender`` with ``baseline``; ratio > 1 means the contender is slower.

    Times and bandwidths are medians; the ratio is the median of paired per-round ratios (see :class:`Row`).
    """
    header = (
        f"{'size':>7} | {baseline + ' us':>13} {'algbw GB/s':>10} {'busbw GB/s':>10} | "
        f"{contender + ' us':>13} {'algbw GB/s':>10} {'busbw GB/s':>10} | {'paired ratio':>12}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = []
        for name in (baseline, contender):
            seconds = row.seconds[name]
            algbw = row.nbytes / seconds / 1e9
            cells.append(f"{seconds * 1e6:13.1f} {algbw:10.3f} {bus_bandwidth(algbw, world):10.3f}")
        ratio = row.ratios[f"{contender}/{baseline}"]
        lines.append(f"{_human(row.nbytes):>7} | {cells[0]} | {cells[1]} | {ratio:12.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma-separated sizes (default {DEFAULT_SIZES})"
    )
    parser.add_argument(
        "--rounds", type=int, default=15, help="minimum interleaved calls per method and size"
    )
    parser.add_argument(
        "--target-ms",
        type=float,
        default=300.0,
        help="run each method about this long per size (more rounds)",
    )
    parser.add_argument("--many", type=int, default=64, help="tensors reduced together (0: skip)")
    parser.add_argument("--many-size", default="1K", help="size of each of those tensors")
    parser.add_argument("--json", dest="json_path", help="also write the medians to this JSON file (rank 0)")
    parser.add_argument("--backend", default=None, help="torch.distributed backend (default: nccl if CUDA)")
    args = parser.parse_args(argv)

    collectives.init(backend=args.backend)
    device = collectives.device()
    world = collectives.size()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    rows = sweep(sizes, args.rounds, args.target_ms / 1000, device)
    many = sweep_many(args.many, parse_size(args.many_size), args.rounds, device) if args.many > 0 else None
    if collectives.is_coordinator():
        print(
            f"allreduce float32, {world} ranks, backend {collectives.backend()}, device {device}, "
            "median time per call, methods interleaved call by call"
        )
        print("\nin-place sum: collectives.allreduce_(t, op=Sum) vs torch.distributed.all_reduce(t)")
        print(format_table(rows, world, "raw sum", "coll sum"))
        print("\nin-place average: collectives.allreduce_(t) vs all_reduce(t); t.div_(n)")
        print(format_table(rows, world, "raw avg", "coll avg"))
        print("\nout-of-place average: collectives.allreduce(t) (a new tensor) vs all_reduce(t); t.div_(n)")
        print(format_table(rows, world, "raw avg", "coll avg out"))
        print("\ncontrol: all_reduce(t) vs the very same call again (the ratio shows the measurement noise)")
        print(format_table(rows, world, "raw sum", "raw sum again"))
        if many is not None:
            each = _human(many.nbytes // args.many)
            print(f"\n{args.many} tensors of {each}, summed: median ms for all of them, ratio to grouped")
            for name, seconds in many.seconds.items():
                ratio = many.ratios.get(f"{name}/grouped", 1.0)
                print(f"{name:>10} | {seconds * 1e3:9.3f} ms | {ratio:6.3f}")
        if args.json_path:
            with open(args.json_path, "w") as handle:
                json.dump(
                    {
                        "world": world,
                        "backend": collectives.backend(),
                        "rows": [dataclasses.asdict(r) for r in rows],
                        "many": None if many is None else dataclasses.asdict(many),
                    },
                    handle,
                    indent=2,
                )
    collectives.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
