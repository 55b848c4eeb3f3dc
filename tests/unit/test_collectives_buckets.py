"""The one bucketing rule (collectives/buckets.py), checked against DDP's own bucket assignment."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from collectives.buckets import assign_buckets, fuse, unflatten_into  # noqa: E402

MB = 1024 * 1024


def resnet_like_gradients() -> list[torch.Tensor]:
    """Gradient shapes of a small ResNet in reverse registration order (the order the optimizer uses)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 3, 3), (64,), (64,)]
    for width, previous in ((64, 64), (128, 64), (256, 128), (512, 256)):
        shapes += [(width, previous, 3, 3), (width,), (width,), (width, width, 3, 3), (width,), (width,)]
    shapes += [(1000, 512), (1000,)]
    return [torch.empty(shape) for shape in reversed(shapes)]


CASES = {
    "resnet, DDP's default caps": (resnet_like_gradients(), 25 * MB, 1 * MB),
    "resnet, small caps": (resnet_like_gradients(), 2 * MB, 0.5 * MB),
    "mixed dtypes": (
        [
            torch.empty(300_000),
            torch.empty(10, dtype=torch.float64),
            torch.empty(3_000_000),
            torch.empty(7, dtype=torch.float16),
            torch.empty(5_000_000),
            torch.empty(200_000, dtype=torch.float64),
        ],
        4 * MB,
        1 * MB,
    ),
    "every tensor over the cap": ([torch.empty(1000) for _ in range(4)], 100, 100),
}


@pytest.mark.parametrize(("tensors", "cap", "first_cap"), CASES.values(), ids=list(CASES))
def test_buckets_are_laid_out_as_ddp_lays_them_out(
    tensors: list[torch.Tensor], cap: int, first_cap: int
) -> None:
    ddp_buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [int(first_cap), int(cap)])
    ours = assign_buckets(tensors, cap, first_cap)
    index = {id(t): i for i, t in enumerate(tensors)}
    assert [[index[id(t)] for t in bucket] for bucket in ours] == [list(b) for b in ddp_buckets]


def test_without_a_cap_each_dtype_and_device_is_one_bucket_in_first_seen_order() -> None:
    a, b, c, d = torch.ones(2), torch.ones(3, dtype=torch.int64), torch.ones(2, 2), torch.ones(1)
    assert assign_buckets([a, b, c, d]) == [[a, c, d], [b]]
    ((floats, flat_floats), (ints, flat_ints)) = fuse([a, b, c, d])
    assert floats == [a, c, d] and ints == [b]
    assert torch.equal(flat_floats, torch.ones(7)) and flat_ints.dtype == torch.int64
    unflatten_into(torch.arange(7.0), floats)
    assert torch.equal(a, torch.tensor([0.0, 1.0]))
    assert torch.equal(c, torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    assert torch.equal(d, torch.tensor([6.0]))


def test_tensors_of_one_kind_fuse_into_one_copy_outside_autograd_and_come_back() -> None:
    weights = [torch.full((3,), float(i), requires_grad=True) for i in range(3)]
    ((members, flat),) = fuse(weights)
    assert members == weights and flat.tolist() == [0.0] * 3 + [1.0] * 3 + [2.0] * 3
    assert not flat.requires_grad  # a copy for the wire, not a node of the graph
    flat.add_(1.0)
    assert weights[0].tolist() == [0.0] * 3  # a copy, not a view
    with torch.no_grad():
        unflatten_into(flat, members)
    assert [w.tolist() for w in weights] == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
    (single,) = fuse([torch.ones(2, 2)])
    assert single[1].shape == (4,) and single[1].data_ptr() != single[0][0].data_ptr()
    assert fuse([]) == []
