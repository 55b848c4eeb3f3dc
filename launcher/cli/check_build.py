"""horovodrun's ``--check-build``: which frameworks, controllers and tensor operations this machine's
collectives offers, in horovodrun's layout (collectives' build queries answer each line)."""

from __future__ import annotations

from launcher import __version__

__all__ = ["build_report"]


def _mark(available: object) -> str:
    return "X" if available else " "


def build_report() -> str:
    """The lines horovodrun's ``--check-build`` prints, answered by collectives on this machine's torch."""
    import torch

    from collectives import features

    gloo, nccl = features.gloo_built(), features.nccl_built()
    return "\n".join(
        [
            f"distrun v{__version__} (collectives: Horovod's API on torch {torch.__version__}):",
            "",
            "Available Frameworks:",
            f"    [{_mark(False)}] TensorFlow",
            f"    [{_mark(True)}] PyTorch",
            f"    [{_mark(False)}] MXNet",
            "",
            "Available Controllers:",
            f"    [{_mark(features.mpi_built())}] MPI",
            f"    [{_mark(gloo)}] Gloo",
            "",
            "Available Tensor Operations:",
            f"    [{_mark(nccl)}] NCCL",
            f"    [{_mark(features.ddl_built())}] DDL",
            f"    [{_mark(features.ccl_built())}] CCL",
            f"    [{_mark(features.mpi_built())}] MPI",
            f"    [{_mark(gloo)}] Gloo",
        ]
    )
