"""Horovod's API and semantics, with 2 and 3 real gloo ranks under distrun.

One job per world size runs workers/horovod_api_worker.py; each test below judges one scenario from every
rank's saved results. The mismatch scenarios are the point of the negotiation: every rank must get
MismatchError (never a hang, never garbage), and the job must stay in step afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.collectives_checks import worker_job

torch = pytest.importorskip("torch")

WORKER = Path(__file__).resolve().parent / "workers" / "horovod_api_worker.py"

Job = tuple[int, list[dict[str, Any]]]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Job:
    size: int = request.param
    size, results, _ = worker_job(size, tmp_path_factory.mktemp(f"horovod{size}"), worker=WORKER)
    return size, results


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("shape", "tensor shapes"),
        ("rank_of_tensor", "tensor shapes"),
        ("dtype", "data types"),
        ("op", "reduction ops"),
        ("name", "names"),
        ("root", "root ranks"),
        ("allgather_trailing", "trailing dimensions"),
        ("collective", "different collectives"),
        ("process_set", "different collectives"),
        ("shutdown", "different collectives"),
    ],
)
def test_a_mismatch_raises_the_same_error_on_every_rank(job: Job, scenario: str, words: str) -> None:
    size, results = job
    seen = [res["mismatches"][scenario] for res in results]
    assert all(s.get("mismatch") for s in seen), seen
    assert all(words in s["message"] for s in seen), seen
    # Every rank names every rank's value, so the message is the same everywhere.
    assert len({s["message"] for s in seen}) == 1
    assert f"rank {size - 1}" in seen[0]["message"]


def test_ranks_stay_in_step_after_mismatches(job: Job) -> None:
    size, results = job
    expected = torch.full((2,), float(sum(range(size))))
    for res in results:
        torch.testing.assert_close(res["mismatches"]["after"]["value"], expected)


def test_allreduce_arguments_as_horovod_takes_them(job: Job) -> None:
    size, results = job
    base = torch.arange(4.0)
    total = base * size + sum(range(size))
    for res in results:
        api = res["apis"]
        torch.testing.assert_close(api["allreduce_average_positional"], total / size)
        torch.testing.assert_close(api["allreduce_sum_scaled"], total)
        torch.testing.assert_close(api["allreduce_inplace_positional"], total)
        # Integer averages truncate, as Horovod's do.
        assert api["allreduce_int_average"].item() == sum(r * 3 + 1 for r in range(size)) // size
        torch.testing.assert_close(api["async_result"], total)
        assert api["poll_after_synchronize"] is True
        assert api["duplicate_name"]["error"] == "ArgumentError"
        assert "in flight" in api["duplicate_name"]["message"]
        assert api["blocking_mismatch"]["mismatch"], api["blocking_mismatch"]
        assert "in flight" in api["duplicate_name_after_mismatch"].get("message", ""), "the name stays held"
        torch.testing.assert_close(api["grouped"][0], total)
        torch.testing.assert_close(
            api["grouped"][1], torch.full((2,), float(sum(range(size))), dtype=torch.float64)
        )


def test_gather_broadcast_alltoall_reducescatter(job: Job) -> None:
    size, results = job
    gathered = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
    for rank, res in enumerate(results):
        api = res["apis"]
        torch.testing.assert_close(api["allgather_variable"], gathered)
        torch.testing.assert_close(api["broadcast_async"], torch.arange(4.0) + size - 1)
        out, received = api["alltoall_splits"]
        # Rank s sends splits_s[r] = 1 + (s + r) % 2 rows to rank r.
        expect_counts = [1 + (s + rank) % 2 for s in range(size)]
        assert received.tolist() == expect_counts
        pieces = []
        for s in range(size):
            splits = [1 + (s + r) % 2 for r in range(size)]
            start = sum(splits[:rank])
            pieces.append(torch.arange(float(start), float(start + splits[rank])) + 100 * s)
        torch.testing.assert_close(out, torch.cat(pieces))
        even = torch.cat([torch.arange(2.0 * rank, 2.0 * rank + 2) + 100 * s for s in range(size)])
        torch.testing.assert_close(api["alltoall_even"], even)
        rows = 2 + (1 if rank == 0 else 0)
        total = float(sum(r + 1 for r in range(size)))
        torch.testing.assert_close(api["reducescatter_uneven"], torch.full((rows, 2), total))
        assert api["broadcast_object"] == {"from": size - 1}
        assert api["allgather_object"] == [r * 10 for r in range(size)]
        torch.testing.assert_close(api["sparse_sum"], torch.tensor([[1.0, 2.0]] * size))


def test_gradients_flow_through_collectives_as_in_horovod(job: Job) -> None:
    size, results = job
    for rank, res in enumerate(results):
        api = res["apis"]
        # d/dx sum(allreduce_sum(x)) = allreduce_sum(ones) = size.
        torch.testing.assert_close(api["allreduce_grad"], torch.full((3,), float(size)))
        # Horovod's allgather gradient: the averaged incoming gradient's rows of this rank.
        torch.testing.assert_close(api["allgather_grad"], torch.full((rank + 1, 2), 2.0))


def test_compression_and_feature_queries(job: Job) -> None:
    _, results = job
    for res in results:
        api = res["apis"]
        assert api["compression"] == (torch.float16, torch.float64)
        features = api["features"]
        assert features["mpi_enabled"] is False and features["ccl_built"] is False
        assert features["gloo_enabled"] is True
        assert features["timeline"]["error"] == "NotImplementedError"
        assert "torch.profiler" in features["timeline"]["message"]
        assert features["adasum"]["error"] == "NotImplementedError"


def test_process_sets_on_subgroups(job: Job) -> None:
    size, results = job
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    for rank, res in enumerate(results):
        ps = res["process_sets"]
        mine = evens if rank % 2 == 0 else odds
        torch.testing.assert_close(ps["sum"], torch.tensor([float(sum(mine))]))
        assert ps["rank_size_included"] == (mine.index(rank), len(mine), rank % 2 == 0, rank % 2 == 1)
        torch.testing.assert_close(ps["broadcast"], torch.tensor([float(mine[-1])]))
        assert ps["allgather"].tolist() == mine
        assert "not a member" in ps["not_a_member"]["message"]
        assert ps["removed"] == (True, True, None)


def test_join_lets_ranks_with_fewer_batches_finish(job: Job) -> None:
    size, results = job
    active = range(size - 1)
    for rank, res in enumerate(results):
        j = res["join"]
        # The rank that joined last; the first joiner (size - 1) never is, as in Horovod.
        assert j["join_everywhere"] == [j["join_returned"]] * size
        assert j["join_returned"] != size - 1
        if rank in active:
            # The joined rank contributes zeros and Average divides by the full size.
            expected = sum(r + 1 for r in active) / size
            torch.testing.assert_close(j["average_with_joined"], torch.full((3,), expected))
            torch.testing.assert_close(j["grouped_with_joined"][0], torch.full((3,), expected * size))
            assert j["allgather_with_joined"].get("mismatch"), j["allgather_with_joined"]


def test_distributed_optimizer_steps_with_a_joined_rank(job: Job) -> None:
    size, results = job
    assert {res["optimizer_join"]["last"] for res in results} == {results[1]["optimizer_join"]["last"]}
    everyone = sum(r + 1 for r in range(size)) / size
    without_rank0 = sum(r + 1 for r in range(1, size)) / size
    for rank, res in enumerate(results):
        grads = res["optimizer_join"]["grads"]
        assert len(grads) == (1 if rank == 0 else 3)
        torch.testing.assert_close(grads[0], torch.full((1, 2), everyone))
        for grad in grads[1:]:
            torch.testing.assert_close(grad, torch.full((1, 2), without_rank0))
        # The second step went out unagreed (rank 0 took part in it from join()); the third was agreed.
        assert res["optimizer_join"]["unagreed"] == (0 if rank == 0 else 1)


def test_a_rank_joins_while_an_optimizer_steps_unagreed_and_the_others_step_another(job: Job) -> None:
    size, results = job
    assert len({res["optimizer_join_two"]["last"] for res in results}) == 1
    everyone = torch.full((1, 2), sum(r + 1 for r in range(size)) / size)
    without_rank0 = torch.full((1, 2), sum(r + 1 for r in range(1, size)) / size)
    for rank, res in enumerate(results):
        seen = res["optimizer_join_two"]
        for grad in seen["before"] + seen["after"]:
            torch.testing.assert_close(grad, everyone)
        assert len(seen["alone"]) == (0 if rank == 0 else 2)
        for grad in seen["alone"]:
            torch.testing.assert_close(grad, without_rank0)
        # The second step of each pair went out unagreed; the gradient channel stayed in step.
        assert seen["unagreed"] == 2
        torch.testing.assert_close(seen["in_step"], torch.tensor([float(size)]))


def test_an_optimizer_step_against_another_collective_raises_everywhere(job: Job) -> None:
    size, results = job
    for res in results:
        mismatch = res["optimizer_mismatch"]
        assert mismatch["result"].get("mismatch"), mismatch["result"]
        torch.testing.assert_close(mismatch["after"], torch.tensor([float(size)]))


def test_broadcast_optimizer_state_initialises_fresh_state(job: Job) -> None:
    _, results = job
    momentum = results[0]["optimizer_state"]["momentum"]
    for res in results:
        state = res["optimizer_state"]
        assert state["frozen_grad_is_none"]
        torch.testing.assert_close(state["weights_grad"], torch.zeros(4))
        assert state["weights_unchanged"]
        torch.testing.assert_close(state["momentum"], momentum)
