"""The measurement process of `distrun check --perf`: one per host, started by its agent like a rank.

Not part of the shipped agent (it needs torch): its source travels as `python -c SOURCE SPEC`, run by the
ranks' interpreter with the launch's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, NCCL_*/GLOO_*). SPEC
is JSON (see launcher.check.perf.Spec). It prints STAGE lines as it gets through start-up, so a host that
cannot join is told apart from the ones waiting for it, and one RESULT line of JSON at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

STAGE = "DISTRUN-PERF-STAGE "
RESULT = "DISTRUN-PERF-RESULT "


def say(prefix: str, value: str) -> None:
    sys.stdout.write(prefix + value + "\n")
    sys.stdout.flush()


say(STAGE, "started")
import torch  # noqa: E402 - the stage line above tells a slow import from a missing host
import torch.distributed as dist  # noqa: E402

say(STAGE, "imported")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_compute(seconds: float, window: float) -> float:
    """GFLOP/s of a float32 matrix product on one of this host's cores: the best `window` within `seconds`.
    The best window is what a core does when it has the CPU; a host throttled (a CPU quota, a slow clock) is
    slow in every window, while a host only briefly crowded is not.

    One thread, because a figure across threads measures the thread pool's scheduling more than the CPU:
    where cores are shared (containers, several simulated hosts on one machine, a busy login node) a pool
    spinning at its barriers while a thread waits for a core was 1.3 to 155 GFLOP/s on the same idle cores,
    run after run; one thread per host is steady and is what a quota or a slow clock lowers."""
    n = 256
    a, b = torch.rand(n, n), torch.rand(n, n)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.mm(a, b)
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < window:
                torch.mm(a, b)
                done += 1
            best = max(best, 2.0 * n**3 * done / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(threads)


def gpu_compute(index: int, seconds: float) -> dict[str, Any]:
    """TFLOP/s of a matrix product on GPU `index`: bf16 where the GPU has it, else fp16."""
    device = torch.device("cuda", index)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    sync(device)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(5):
            torch.mm(a, b)
        sync(device)
        done += 5
    elapsed = time.perf_counter() - start
    return {
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp16",
        "tflops": 2.0 * n**3 * done / elapsed / 1e12,
    }


def intra_host(nbytes: int, repeats: int) -> float:
    """Bus bandwidth (bytes/s) of an all-reduce over this host's GPUs, NCCL from this one process."""
    from torch.cuda import nccl

    count = torch.cuda.device_count()
    tensors = [torch.ones(nbytes // 4, device=torch.device("cuda", i)) for i in range(count)]
    nccl.all_reduce(tensors)  # type: ignore[no-untyped-call]
    for i in range(count):
        torch.cuda.synchronize(i)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        nccl.all_reduce(tensors)  # type: ignore[no-untyped-call]
        for i in range(count):
            torch.cuda.synchronize(i)
        best = min(best, time.perf_counter() - start)
    return 2.0 * (count - 1) / count * nbytes / best


def ping_pong(partner: int, first: bool, device: torch.device, pings: int) -> float:
    """The median one-way latency (seconds) of a 4-byte message, half of each round trip."""
    token = torch.zeros(1, device=device)
    trips = []
    for _ in range(pings + 1):
        start = time.perf_counter()
        if first:
            dist.send(token, partner)
            dist.recv(token, partner)
        else:
            dist.recv(token, partner)
            dist.send(token, partner)
        sync(device)
        trips.append(time.perf_counter() - start)
    return statistics.median(trips[1:]) / 2.0  # the first trip also sets the pair's connection up


def send_timed(partner: int, buffer: torch.Tensor, token: torch.Tensor, device: torch.device) -> float:
    """Seconds until `partner` acknowledged all of `buffer`."""
    start = time.perf_counter()
    dist.send(buffer, partner)
    dist.recv(token, partner)
    sync(device)
    return time.perf_counter() - start


def receive(partner: int, buffer: torch.Tensor, token: torch.Tensor, device: torch.device) -> None:
    dist.recv(buffer, partner)
    sync(device)
    dist.send(token, partner)


def one_way(
    sending: bool,
    partner: int,
    *,
    buffer: torch.Tensor,
    token: torch.Tensor,
    device: torch.device,
    spec: dict[str, Any],
) -> float | None:
    """Transfers of `buffer` one way, as many as fit in `repeat_seconds` (at most `link_repeats`), so that a
    fast link is timed more than once and a slow one only once; the sender decides and says so before each.
    The best time (the sender's; None on the receiving side)."""
    flag = torch.zeros(1, device=device)
    if not sending:
        while True:
            dist.recv(flag, partner)
            sync(device)
            if not flag.item():
                return None
            receive(partner, buffer, token, device)
    times: list[float] = []
    while len(times) < spec["link_repeats"] and (not times or sum(times) < spec["repeat_seconds"]):
        flag.fill_(1)
        dist.send(flag, partner)
        times.append(send_timed(partner, buffer, token, device))
    flag.fill_(0)
    dist.send(flag, partner)
    sync(device)
    return min(times)


def link(me: int, partner: int, device: torch.device, spec: dict[str, Any]) -> dict[str, Any]:
    """This host's side of one pair: latency, then the buffer each way (the lower rank sends first);
    `out_Bps` is what this host sent at, as it saw the partner acknowledge it."""
    first = me < partner
    latency = ping_pong(partner, first, device, spec["pings"])
    nbytes = spec["gpu_link_bytes" if device.type == "cuda" else "link_bytes"]
    buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    token = torch.zeros(1, device=device)
    best = float("inf")
    for sending in (first, not first):
        took = one_way(sending, partner, buffer=buffer, token=token, device=device, spec=spec)
        best = took if took is not None else best
    return {"partner": partner, "latency_s": latency, "out_Bps": nbytes / best}


def all_hosts(nbytes: int, device: torch.device, world: int) -> float:
    """Bus bandwidth (bytes/s) of one all-reduce over every host (the second of two: the first connects)."""
    tensor = torch.ones(max(1, nbytes // 4), device=device)
    dist.all_reduce(tensor)
    sync(device)
    start = time.perf_counter()
    dist.all_reduce(tensor)
    sync(device)
    return 2.0 * (world - 1) / world * nbytes / (time.perf_counter() - start)


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = torch.device("cuda", 0) if gpus else torch.device("cpu")
    timeout = timedelta(seconds=spec["timeout"])
    if gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpus else "gloo", timeout=timeout)
    # Barriers on the CPU whatever the data's back end: they only keep the rounds apart.
    control = dist.new_group(backend="gloo", timeout=timeout) if gpus else None
    say(STAGE, "joined")
    result: dict[str, Any] = {"rank": rank, "backend": "nccl" if gpus else "gloo", "gpus": []}
    links: list[dict[str, Any]] = []
    result["links"] = links
    passes: list[float] = []
    compute = rank in spec["compute_ranks"]
    if compute:
        if gpus:
            result["gpus"] = [gpu_compute(i, spec["compute_seconds"]) for i in range(gpus)]
            if gpus > 1:
                result["intra_host_Bps"] = intra_host(spec["intra_bytes"], 3)
        else:
            passes.append(cpu_compute(spec["compute_seconds"], spec["compute_window"]))
    dist.barrier(group=control)
    for pairs in spec["rounds"]:
        partner = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
        if partner is not None:
            links.append(link(rank, partner, device, spec))
        dist.barrier(group=control)
    nbytes = spec["gpu_allreduce_bytes" if gpus else "allreduce_bytes"]
    if nbytes and world > 1:
        result["allreduce_Bps"] = all_hosts(nbytes, device, world)
    if compute and not gpus:
        # Measured again after the transfers: a figure is the better of two moments, so a host that was
        # only briefly busy is not named.
        passes.append(cpu_compute(spec["compute_seconds"], spec["compute_window"]))
        result["compute_GFLOPs"] = max(passes)
    say(RESULT, json.dumps(result))
    dist.barrier(group=control)
    # Every host has said its result (the barrier), so nobody's collective can fail now: exit at once. A
    # clean shutdown of the group and of torch took 6 s at 32 simulated hosts, for nothing anyone reads.
    os._exit(0)


if __name__ == "__main__":
    main()
