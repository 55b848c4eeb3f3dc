"""Shuffle-then-shard data splitting (method B of seed article 004).

Every epoch all ranks draw the same permutation of the whole data set from a shared seed, and rank r takes
every size-th element starting at r. Each sample is therefore seen exactly once per epoch across the ranks,
and each rank sees a different, freshly mixed subset every epoch. Sharding a fixed order without shuffling
(method A) gives every rank the same few samples forever, which is why shuffling cannot be switched off
without asking for it (``shuffle=False``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sized

from collectives.errors import ShardingError

__all__ = ["ShardSampler", "shard_indices"]


def _permutation(num_samples: int, seed: int, epoch: int) -> list[int]:
    order = list(range(num_samples))
    # A str seed is hashed with SHA-512, so every process derives the same permutation.
    random.Random(f"collectives:{seed}:{epoch}").shuffle(order)
    return order


def _check(num_samples: int, rank: int, size: int) -> None:
    if size < 1 or not 0 <= rank < size:
        raise ShardingError(f"rank {rank} is not in a job of size {size}")
    if num_samples < size:
        raise ShardingError(f"cannot shard {num_samples} samples over {size} ranks: every rank needs one")


def _usable(num_samples: int, size: int, drop_last: bool) -> int:
    """How many samples of an epoch are sharded: all, or with ``drop_last`` a multiple of ``size``."""
    return num_samples - num_samples % size if drop_last else num_samples


def shard_indices(
    num_samples: int,
    rank: int,
    size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[int]:
    """The sample indices rank ``rank`` of ``size`` should use in ``epoch``.

    Shards differ in length by at most one. With ``drop_last`` the last ``num_samples % size`` samples of the
    epoch's permutation are skipped so that every shard has the same length (a different few each epoch).
    """
    _check(num_samples, rank, size)
    order = _permutation(num_samples, seed, epoch) if shuffle else list(range(num_samples))
    return order[: _usable(num_samples, size, drop_last)][rank::size]


class ShardSampler:
    """A ``torch.utils.data.Sampler``-compatible sampler yielding this rank's shard; call ``set_epoch``.

    ``rank`` and ``size`` default to the process group's (``collectives.init()`` first). Use
    :meth:`batches` when a training loop must take the same number of steps on every rank: with an uneven
    split a plain DataLoader can give one rank an extra batch, and its extra allreduce would hang the job.
    """

    def __init__(
        self,
        data: int | Sized,
        *,
        rank: int | None = None,
        size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if rank is None or size is None:
            from collectives import context

            rank = context.rank() if rank is None else rank
            size = context.size() if size is None else size
        self.num_samples = data if isinstance(data, int) else len(data)
        self.rank = rank
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        # Validated now rather than at the first iteration.
        _check(self.num_samples, rank, size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation to use (same value on every rank)."""
        self.epoch = epoch

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch."""
        return shard_indices(
            self.num_samples,
            self.rank,
            self.size,
            epoch=self.epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        return len(range(self.rank, _usable(self.num_samples, self.size, self.drop_last), self.size))

    def longest_shard(self) -> int:
        """Length of the longest shard (shards differ by at most one sample)."""
        return -(-_usable(self.num_samples, self.size, self.drop_last) // self.size)

    def num_batches(self, batch_size: int) -> int:
        """Number of batches :meth:`batches` yields; the same on every rank."""
        if batch_size < 1:
            raise ShardingError(f"batch_size must be >= 1, got {batch_size}")
        return -(-self.longest_shard() // batch_size)

    def batches(self, batch_size: int) -> list[list[int]]:
        """This epoch's shard cut into :meth:`num_batches` non-empty batches of at most ``batch_size``.

        A rank whose shard is one sample short gets a last batch one smaller, or, if that would leave it
        empty, its last two batches share the remaining samples; so every rank takes the same number of
        steps and every sample is still used exactly once.
        """
        count = self.num_batches(batch_size)
        own = self.indices()
        out = [own[i * batch_size : (i + 1) * batch_size] for i in range(count)]
        if not out[-1]:
            if count < 2 or len(out[-2]) < 2:
                raise ShardingError(
                    f"rank {self.rank} has {len(own)} samples, too few for {count} batches of "
                    f"{batch_size}; use drop_last=True or another batch size"
                )
            out[-1] = [out[-2].pop()]
        return out
