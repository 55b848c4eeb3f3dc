"""horovodrun's ``--check-build``: which frameworks, controllers and tensor operations collectives offers
the ranks' interpreter on this machine, in horovodrun's layout. That interpreter answers (collectives' own
build queries, ``hvd.nccl_built()`` and the rest): the launcher never imports the worker library."""

from __future__ import annotations

from launcher import __version__
from launcher.agent.software import ask

__all__ = ["BUILD_PROBE", "build_report"]

# Run by the ranks' interpreter: collectives' build queries, as a rank would ask them.
BUILD_PROBE = """
import json
try:
    import torch
    from collectives import features as f
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)[:200]}))
else:
    print(json.dumps({"torch": torch.__version__, "mpi": f.mpi_built(), "gloo": f.gloo_built(),
                      "nccl": f.nccl_built(), "ddl": f.ddl_built(), "ccl": f.ccl_built()}))
"""


def _mark(available: object) -> str:
    return "X" if available else " "


def build_report(python: str) -> str:
    """The lines horovodrun's ``--check-build`` prints, answered by `python` (the ranks' interpreter)."""
    found = ask(python, BUILD_PROBE)
    error = found.get("error") if isinstance(found, dict) else "no answer"
    built = {} if error else found
    torch = f"torch {built['torch']}" if built else f"not importable by {python}: {error}"
    return "\n".join(
        [
            f"distrun v{__version__} (collectives, Horovod's API on torch.distributed; {torch}):",
            "",
            "Available Frameworks:",
            f"    [{_mark(False)}] TensorFlow",
            f"    [{_mark(built)}] PyTorch",
            f"    [{_mark(False)}] MXNet",
            "",
            "Available Controllers:",
            f"    [{_mark(built.get('mpi'))}] MPI",
            f"    [{_mark(built.get('gloo'))}] Gloo",
            "",
            "Available Tensor Operations:",
            f"    [{_mark(built.get('nccl'))}] NCCL",
            f"    [{_mark(built.get('ddl'))}] DDL",
            f"    [{_mark(built.get('ccl'))}] CCL",
            f"    [{_mark(built.get('mpi'))}] MPI",
            f"    [{_mark(built.get('gloo'))}] Gloo",
        ]
    )
