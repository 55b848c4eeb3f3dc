"""collectives as a plain single process (world size 1): a real gloo group, no launcher."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import collectives as hvd  # noqa: E402

CONTRACT_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_SIZE",
    "LOCAL_WORLD_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def single(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in CONTRACT_VARS:
        monkeypatch.delenv(name, raising=False)
    hvd.init(backend="gloo")
    try:
        yield
    finally:
        hvd.shutdown()


@pytest.mark.usefixtures("single")
def test_topology_and_idempotent_init() -> None:
    assert (
        hvd.rank(),
        hvd.size(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
    ) == (
        0,
        1,
        0,
        1,
        0,
        1,
    )
    assert hvd.is_coordinator()
    assert hvd.backend() == "gloo"
    assert hvd.init() == hvd.init()
    hvd.barrier()


def test_shutdown_then_reinit(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTRACT_VARS:
        monkeypatch.delenv(name, raising=False)
    hvd.init()
    hvd.shutdown()
    with pytest.raises(hvd.NotInitializedError):
        hvd.size()
    hvd.init()
    assert hvd.size() == 1
    hvd.shutdown()


@pytest.mark.usefixtures("single")
def test_collectives_are_identities() -> None:
    t = torch.arange(6.0).view(3, 2)
    for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        assert torch.equal(hvd.allreduce(t, op=op), t)
    assert torch.equal(hvd.allreduce_async(t).wait(), t)
    assert torch.equal(hvd.allgather(t), t)
    assert torch.equal(hvd.allgather(torch.tensor(3.0)), torch.tensor([3.0]))
    assert torch.equal(hvd.broadcast(t), t)
    assert hvd.broadcast_object({"a": [1]}) == {"a": [1]}
    assert hvd.allgather_object("x") == ["x"]
    assert torch.equal(hvd.alltoall(t), t)
    assert torch.equal(hvd.reduce_scatter(t), t)
    grouped = hvd.grouped_allreduce([t, torch.ones(2, dtype=torch.float64)])
    assert torch.equal(grouped[0], t) and grouped[1].dtype == torch.float64
    assert hvd.average_metrics({"loss": 0.5, "acc": torch.tensor(0.25)}) == {"loss": 0.5, "acc": 0.25}


@pytest.mark.usefixtures("single")
def test_bad_arguments_raise_collectives_errors() -> None:
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(hvd.CollectivesError, match="splits"):
        hvd.alltoall(torch.ones(3), splits=[2])
    with pytest.raises(hvd.CollectivesError, match="scalar"):
        hvd.average_metrics({"v": torch.ones(2)})
    model = torch.nn.Linear(2, 1)
    with pytest.raises(hvd.CollectivesError, match="op=Average or op=Sum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Max)
    with pytest.raises(hvd.CollectivesError, match="missing from named_parameters"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), [("w", model.weight)])


@pytest.mark.usefixtures("single")
def test_distributed_optimizer_behaves_like_the_wrapped_one() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), model.named_parameters(), backward_passes_per_step=2
    )
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    assert opt.param_groups is opt.optimizer.param_groups
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        # Horovod sums the passes: half of each mean loss makes the mean over the whole batch.
        (model(x[:4]).pow(2).mean() / 2).backward()
        (model(x[4:]).pow(2).mean() / 2).backward()
        opt.step()
        ref_opt.zero_grad()
        reference(x).pow(2).mean().backward()
        ref_opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()
    assert "DistributedOptimizer(Adam" in repr(opt)


@pytest.mark.usefixtures("single")
def test_synchronize_then_clip_then_step() -> None:
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters())
    model(torch.full((2, 3), 100.0)).sum().backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    before = model.weight.detach().clone()
    with opt.skip_synchronize():
        opt.step()
    assert float((before - model.weight.detach()).norm()) <= 1.0 + 1e-5
    with pytest.raises(hvd.GradientSyncError, match="closure"):
        opt.step(lambda: 0.0)


@pytest.mark.usefixtures("single")
def test_synchronize_then_step_reduces_the_gradients_once() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters(), backward_passes_per_step=2
    )
    x = torch.ones(1, 2)
    for _ in range(2):
        model(x).sum().backward()
    opt.synchronize()
    # Two passes of gradient 1, summed over the passes as in Horovod: 2.
    assert torch.equal(model.weight.grad, torch.full((1, 2), 2.0))
    opt.synchronize()
    opt.step()  # no skip_synchronize(): step() must see that the gradients are reduced already
    assert torch.equal(model.weight.grad, torch.full((1, 2), 2.0))
    assert torch.equal(model.weight.detach(), torch.full((1, 2), -1.0))
    # The next backward passes are new gradients, reduced again by the next step().
    opt.zero_grad()
    for _ in range(2):
        model(2 * x).sum().backward()
    with opt.skip_synchronize():  # Horovod's idiom; without synchronize() first it still reduces
        opt.step()
    assert torch.equal(model.weight.grad, torch.full((1, 2), 4.0))
    assert torch.equal(model.weight.detach(), torch.full((1, 2), -5.0))


@pytest.mark.usefixtures("single")
def test_grad_scaler_recipe_from_the_docs() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    assert torch.equal(model.weight.grad, torch.ones(1, 2))
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach(), torch.zeros(1, 2))


@pytest.mark.usefixtures("single")
def test_wrapping_the_same_model_again_replaces_the_old_hooks() -> None:
    model = torch.nn.Linear(2, 1)
    x = torch.ones(1, 2)

    def train(opt: hvd.DistributedOptimizer) -> None:
        for _ in range(3):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            assert torch.equal(model.weight.grad, torch.ones(1, 2)), model.weight.grad
            assert torch.equal(model.bias.grad, torch.ones(1))

    dropped = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    del dropped  # e.g. the optimizer rebuilt with other hyper-parameters
    train(hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()))
    kept = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    train(hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()))
    assert "DistributedOptimizer" in repr(kept)


@pytest.mark.usefixtures("single")
def test_sparse_gradients_are_reduced_and_stay_sparse() -> None:
    # sparse_as_dense reduces them densely; the optimizer (SparseAdam, say) still gets a sparse gradient.
    for sparse_as_dense in (False, True):
        embedding = torch.nn.Embedding(4, 2, sparse=True)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(embedding.parameters(), lr=0.1),
            embedding.named_parameters(),
            sparse_as_dense=sparse_as_dense,
        )
        embedding(torch.tensor([1, 2, 2])).sum().backward()
        opt.synchronize()
        grad = embedding.weight.grad
        assert grad is not None
        assert grad.is_sparse
        torch.testing.assert_close(grad.to_dense(), torch.tensor([[0.0, 0], [1, 1], [2, 2], [0, 0]]))
        opt.remove_hooks()


def test_world_of_one_with_an_address_but_no_port(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTRACT_VARS:
        monkeypatch.delenv(name, raising=False)
    # A world of one that names its rank and an address, but no port: no rendezvous is needed.
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    hvd.init(backend="gloo")
    try:
        assert hvd.size() == 1
        assert torch.equal(hvd.allreduce(torch.ones(2)), torch.ones(2))
    finally:
        hvd.shutdown()


@pytest.mark.usefixtures("single")
def test_unused_parameters_get_zero_gradients() -> None:
    used, unused = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    params = [*used.parameters(), *unused.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
    used(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert unused.weight.grad is not None and torch.equal(unused.weight.grad, torch.zeros_like(unused.weight))


@pytest.mark.usefixtures("single")
def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "ckpt.pt"
    assert hvd.save_checkpoint({"w": torch.ones(2), "step": 7}, path) == path
    loaded = hvd.load_checkpoint(path)
    assert loaded is not None and loaded["step"] == 7 and torch.equal(loaded["w"], torch.ones(2))
    assert hvd.load_checkpoint(tmp_path / "missing.pt") is None
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]
    with pytest.raises(hvd.CollectivesError, match="failed on rank 0") as raised:
        hvd.save_checkpoint({"f": lambda: 1}, path)  # a lambda cannot be pickled
    assert raised.value.__cause__ is not None
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]
    assert hvd.load_checkpoint(path) is not None  # the previous checkpoint survived


@pytest.fixture
def events(single: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happens, in order: every allreduce (with its size) and what the test adds."""
    happened: list[str] = []
    real_all_reduce = torch.distributed.all_reduce

    def spy(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        happened.append(f"allreduce {tensor.numel()}")
        return real_all_reduce(tensor, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.distributed, "all_reduce", spy)
    return happened


def test_buckets_start_during_backward_as_soon_as_they_fill(events: list[str]) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 2)
    )
    # Registered before the optimizer's hook, so it runs first: the moment the last gradient is ready.
    first_weight = model[0].weight
    first_weight.register_post_accumulate_grad_hook(lambda _: events.append("first layer ready"))
    # A tiny cap: one bucket per parameter, in reverse registration order.
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), bucket_cap_mb=1e-6
    )
    model(torch.ones(3, 4)).sum().backward()
    events.append("backward done")
    local = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    opt.step()
    # Each bucket carries one element past its gradients (a joined rank's mark: collectives.step_agreement).
    assert events == [
        "allreduce 3",
        "allreduce 33",
        "allreduce 17",
        "allreduce 257",
        "first layer ready",
        "allreduce 65",
        "backward done",
    ]
    # A world of one: the average is the local gradient, written back into every .grad.
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), local, strict=True))


class HeadFirst(torch.nn.Module):
    """Registers its head before its body, so reverse registration order is not the backward order."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(16, 2)
        self.body = torch.nn.Linear(4, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.body(x)))
        return out


def test_buckets_follow_the_gradient_order_from_the_second_step(events: list[str]) -> None:
    model = HeadFirst()
    model.body.weight.register_post_accumulate_grad_hook(lambda _: events.append("body ready"))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), bucket_cap_mb=1e-6
    )
    per_step = []
    for _ in range(3):
        events.clear()
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        per_step.append(list(events))
    # First step: the body's weight, registered last, is the first bucket, ready last: nothing overlaps.
    assert per_step[0] == ["body ready", "allreduce 65", "allreduce 3", "allreduce 33"]
    # Rebuilt in the order the gradients came: the head's buckets start while the body is still computing.
    assert per_step[1] == per_step[2]
    assert sorted(per_step[1][:2]) == ["allreduce 3", "allreduce 33"]
    assert per_step[1][2:] == ["body ready", "allreduce 65"]


def test_duplicate_parameter_names_are_refused_before_init_is_needed() -> None:
    # Horovod's test_duplicate_names builds the optimizer between one test's shutdown() and the next init().
    assert not hvd.is_initialized()
    first, second = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    sgd = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    named = itertools.chain(first.named_parameters(), second.named_parameters())
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(sgd, named_parameters=named)
    with pytest.raises(hvd.NotInitializedError):
        named_ok = [*first.named_parameters(prefix="a"), *second.named_parameters(prefix="b")]
        hvd.DistributedOptimizer(sgd, named_parameters=named_ok)
