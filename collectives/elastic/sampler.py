"""``ElasticSampler``: this rank's share of the samples not yet processed in the epoch, re-cut for the new
world after every reset (kept in a ``TorchState``, whose sync hands every rank rank 0's progress)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from collectives.context import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Horovod's sampler: call ``record_batch`` after each batch and ``set_epoch`` at the end of each epoch.

    ``seed`` must be the same on every rank: the epoch's order is one shuffle that every rank draws alike.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` with nothing processed (call it at an epoch's end, not its start)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every rank processed ``batch_size`` more samples."""
        del batch_idx
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.processed_num = state["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-cut what is left of the epoch for the current world."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        # Padded with the first ones so that every rank gets as many samples (their collectives pair up).
        remaining = self.remaining_indices
        padded = remaining + remaining[: self.total_size - len(remaining)]
        return iter(padded[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
