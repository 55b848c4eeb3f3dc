"""What ``DistributedOptimizer``'s arguments mean: each parameter's name (``named_parameters``, checked as
Horovod checks it) and Horovod's ``groups`` as buckets of one dtype and device."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from collectives.buckets import assign_buckets
from collectives.errors import ArgumentError


def parameter_names(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
) -> dict[torch.nn.Parameter, str]:
    """Each parameter's name for Horovod's messages: from ``named_parameters``, checked against the
    optimizer's parameters, else its place in ``param_groups``."""
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {
            p: f"param_groups[{g}][{i}]"
            for g, group in enumerate(optimizer.param_groups)
            for i, p in enumerate(group["params"])
        }
    named = list(named_parameters)
    names = [name for name, _ in named]
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ArgumentError(f"named_parameters has duplicate names: {duplicates}")
    by_param = {p: name for name, p in named}
    missing = [i for i, p in enumerate(in_optimizer) if p not in by_param]
    if missing:
        raise ArgumentError(
            f"{len(missing)} parameter(s) of the optimizer are missing from named_parameters; pass "
            "model.named_parameters() for the same model the optimizer was built from"
        )
    # Order and membership follow the optimizer: those are the gradients step() consumes.
    return {p: by_param[p] for p in in_optimizer}


def fixed_groups(
    params: list[torch.nn.Parameter], groups: int | Sequence[Sequence[torch.nn.Parameter]] | None
) -> list[list[torch.nn.Parameter]] | None:
    """Horovod's ``groups``: a number of equal runs of parameters, or explicit lists (the rest alone)."""
    if groups is None:
        return None
    if isinstance(groups, int):
        if groups <= 0:
            raise ArgumentError(f"groups must be a positive number or lists of parameters, got {groups}")
        per = -(-len(params) // groups)
        runs = [params[i : i + per] for i in range(0, len(params), per)]
    else:
        known = {id(p) for p in params}
        runs = [[p for p in group if id(p) in known] for group in groups]
        grouped = {id(p) for run in runs for p in run}
        runs += [[p] for p in params if id(p) not in grouped]
    out: list[list[torch.nn.Parameter]] = []
    for run in runs:
        # A bucket holds one dtype and device.
        out.extend(assign_buckets(run))
    return [run for run in out if run]
