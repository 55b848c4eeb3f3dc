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


def test_a_block_of_riders_is_reduced_into_its_tensors_through_a_buffer_kept_while_its_shapes_hold() -> None:
    from collectives.ops._common import block_buffer, reduce_block_payloads
    from collectives.reduce_op import ReduceOp

    reduce_block = reduce_block_payloads(ReduceOp.SUM, 1.0)
    tensors = [torch.zeros(3), torch.zeros(2, 2), torch.zeros(1)]

    def block(*values: list[float]) -> list[torch.Tensor]:
        """Every rank's bytes of the tensors, back to back, as a rank's block carries them."""
        return [torch.tensor(v, dtype=torch.float32).view(torch.uint8) for v in values]

    first = [float(i) for i in range(8)]
    second = [10.0 * i for i in range(8)]
    reduce_block(tensors, block(first, second))
    assert [t.tolist() for t in tensors] == [[0.0, 11.0, 22.0], [[33.0, 44.0], [55.0, 66.0]], [77.0]]
    flat, _ = block_buffer(tensors)
    others = [torch.zeros(3), torch.zeros(2, 2), torch.zeros(1)]  # same shapes: the same buffer
    values = reduce_block(others, block([1.0] * 8, [2.0] * 8))
    assert block_buffer(others)[0] is flat
    # The tensors themselves settle their handles' tickets (a value already there: _handle._Part).
    assert all(v is o for v, o in zip(values, others, strict=True))
    assert others[1].tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert tensors[2].tolist() == [77.0]  # the first block's tensors are theirs, not views of the buffer
    reshaped = [torch.zeros(4), torch.zeros(4)]  # the same bytes in all, other shapes: a buffer of its own
    reduce_block(reshaped, block([1.0] * 8, [1.0] * 8))
    assert block_buffer(reshaped)[0] is not flat
    assert [t.tolist() for t in reshaped] == [[2.0] * 4, [2.0] * 4]
