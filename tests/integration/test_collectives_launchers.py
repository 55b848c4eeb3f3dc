"""collectives.init() under distrun and under torchrun, and the example training job end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, clean_env

pytest.importorskip("torch")

WORKERS = Path(__file__).resolve().parent / "workers"
EXAMPLE = REPO / "examples" / "train.py"


def _run(command: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def _topologies(outdir: Path, size: int) -> list[dict[str, object]]:
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(size)]


def test_init_under_distrun(tmp_path: Path) -> None:
    _run([sys.executable, "-m", "launcher", "-np", "3", str(WORKERS / "topology_worker.py"), str(tmp_path)])
    for rank, record in enumerate(_topologies(tmp_path, 3)):
        assert record == {
            "rank": rank,
            "size": 3,
            "local_rank": rank,
            "local_size": 3,
            "cross_rank": 0,
            "cross_size": 1,
            "backend": "gloo",
            "rank_sum": 3.0,
            "master_addr": record["master_addr"],
        }


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_init_under_torchrun(tmp_path: Path) -> None:
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", str(WORKERS / "topology_worker.py")]
    _run([*command, str(tmp_path)])
    records = _topologies(tmp_path, 2)
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"]) for r in records] == [
        (0, 2, 0, 2),
        (1, 2, 1, 2),
    ]
    assert all(r["cross_size"] == 1 and r["cross_rank"] == 0 and r["rank_sum"] == 1.0 for r in records)


def example_on_two_ranks(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", "-np", "2", str(EXAMPLE), *args]


def test_example_trains_on_two_ranks_and_resumes_from_rank0_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt" / "digits.pt"
    first = tmp_path / "first.json"
    common = ["--batch-size", "32", "--warmup-epochs", "1", "--checkpoint", str(checkpoint)]
    proc = _run(example_on_two_ranks("--epochs", "4", *common, "--json-out", str(first)))
    summary = json.loads(first.read_text())
    assert summary["ranks"] == 2
    assert summary["test_accuracy"] > 0.85, summary
    assert checkpoint.exists()
    # Only rank 0 reports (and the launcher prefixes its lines with [0]).
    epoch_lines = [line for line in proc.stdout.splitlines() if " epoch " in f" {line}"]
    assert epoch_lines and all(line.startswith("[0] ") for line in epoch_lines)

    resumed = tmp_path / "resumed.json"
    proc = _run(example_on_two_ranks("--epochs", "5", "--resume", *common, "--json-out", str(resumed)))
    after = json.loads(resumed.read_text())
    # Resuming after epoch index 3 of 4 leaves exactly one epoch to train; a run that ignored the checkpoint
    # would also end at epoch 4, but would have trained five.
    assert after["start_epoch"] == 4.0 and after["epoch"] == 4.0, after
    epoch_lines = [line for line in proc.stdout.splitlines() if " epoch " in f" {line}"]
    assert len(epoch_lines) == 1 and "epoch   5/5" in epoch_lines[0], epoch_lines
    assert after["test_accuracy"] > 0.85, after


def _fake_gpus(outdir: Path, ranks: int, gpus: int, *backend: str) -> subprocess.CompletedProcess[str]:
    worker = WORKERS / "fake_gpus_worker.py"
    command = [
        sys.executable,
        "-m",
        "launcher",
        "-np",
        str(ranks),
        str(worker),
        str(outdir),
        str(gpus),
        *backend,
    ]
    return subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=240)


def test_two_ranks_on_one_gpu_fall_back_to_gloo_with_one_warning(tmp_path: Path) -> None:
    proc = _fake_gpus(tmp_path, 2, 1)
    assert proc.returncode == 0, proc.stderr
    assert _topologies(tmp_path, 2) == [{"backend": "gloo", "device": "cpu", "sum": 2.0}] * 2
    warnings = [line for line in proc.stderr.splitlines() if "NCCL cannot give each rank its own GPU" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("[0] collectives: host ")
    assert "runs 2 ranks but this rank sees 1 GPU" in warnings[0] and "--gpus-per-rank 1" in warnings[0]


def test_explicit_nccl_on_too_few_gpus_is_refused_before_nccl_runs(tmp_path: Path) -> None:
    proc = _fake_gpus(tmp_path, 2, 1, "nccl")
    assert proc.returncode == 3, proc.stderr
    # Both ranks refuse; the first to exit stops the other, which may not have said so yet (under load, rank
    # 1 said it first and rank 0 was stopped): one line or two, each rank's own.
    said = proc.stderr.splitlines()
    refused = [line for line in said if line.startswith(("[0] refused: ", "[1] refused: "))]
    assert 1 <= len(refused) == len({line[:3] for line in refused}), proc.stderr
    for line in refused:
        assert "backend='nccl' cannot work on host " in line and "NCCL needs a GPU per rank" in line, line
    assert "Duplicate GPU" not in proc.stderr
