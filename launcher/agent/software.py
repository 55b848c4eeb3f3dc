"""What the ranks' interpreter on a host says about itself: torch for `distrun check`, and the software
(Python, torch, CUDA, NCCL) that every multi-host launch compares across hosts. "Stacks" elsewhere in the
agent are call stacks (`launcher.agent.stackdump`); this module's word is "software".

Asking means starting that interpreter (with its site-packages, often on NFS, where it can take seconds), once
per host per launch. The answer is kept per user and host (under the agent's cache root) with what it was
read from: the interpreter, every directory on its `sys.path`, torch's `version.py` and NCCL's
`dist-info`. An install, removal or upgrade changes one of those, so the answer is reused only while each is
as it was (modification time, size, inode, device), and asked again otherwise.

Stdlib-only and Python 3.7 compatible: it is shipped to remote hosts with the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from typing import Any

from launcher.agent.cache_root import default_root

# Run by the host's interpreter for `distrun check`: torch's version and CUDA as that interpreter sees them.
TORCH_PROBE = """
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)[:200]}))
else:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus}))
"""
PROBE_TIMEOUT = 90.0

# Run by the ranks' interpreter: its Python, and torch's version and CUDA/NCCL build, read from files without
# importing torch (which takes seconds); `used` is what the answer was read from. The working directory `-c`
# puts first on sys.path is left out: the ranks' own first entry is their script's directory, not this one.
SOFTWARE_PROBE = r"""
import importlib.util, json, os, re, sys
sys.path = [d for d in sys.path if d]
out = {"python": "%d.%d.%d" % sys.version_info[:3], "torch": "", "cuda": "", "nccl": ""}
used = [os.path.abspath(d) for d in sys.path]
spec = importlib.util.find_spec("torch")
for where in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(where, "version.py")
    try:
        text = open(path).read()
    except OSError:
        continue
    used.append(path)
    for key, name in (("torch", "__version__"), ("cuda", "cuda")):
        m = re.search(r"^" + name + r"\s*(?::[^=]*)?=\s*[\x27\x22]([^\x27\x22]*)", text, re.M)
        out[key] = m.group(1) if m else ""
    break
for d in sys.path:
    try:
        names = os.listdir(d)
    except OSError:
        continue
    found = [re.match(r"nvidia_nccl_cu\d+-([^-]+)\.dist-info$", n) for n in names]
    m = next((f for f in found if f), None)
    if m:
        out["nccl"] = m.group(1)
        used.append(os.path.join(os.path.abspath(d), m.group(0)))
        break
print(json.dumps({"software": out, "used": used}))
"""
UNKNOWN_SOFTWARE = {"python": "?", "torch": "?", "cuda": "?", "nccl": "?"}
# What the interpreter's sys.path depends on besides its files.
_PATH_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH")


def ask(python: str, code: str) -> Any:
    """The JSON that `python -c code` printed last, or {"error": why there is none}."""
    try:
        done = subprocess.run(
            [python, "-c", code],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    try:
        return json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        return {"error": tail[-1] if tail else "exit " + str(done.returncode)}


def _signature(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev]


def _cache_file(python: str, root: str) -> str:
    import hashlib  # only a job that asks for the software (it was ~5 ms of every agent's start)

    key = [socket.gethostname(), python, [os.environ.get(n) for n in _PATH_ENV]]
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
    return os.path.join(root, "software", name + ".json")


def which(program: str) -> str | None:
    """Where `program` runs from, as a shell would find it on PATH; None if nowhere."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) else None
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and os.access(os.path.join(d, program), os.X_OK):
            return os.path.join(d, program)
    return None


def _cached(path: str) -> dict[str, str] | None:
    try:
        with open(path) as f:
            kept = json.load(f)
        if all(_signature(p) == sig for p, sig in kept["seen"]):
            return {str(k): str(v) for k, v in kept["software"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _keep(path: str, software: dict[str, str], used: list[str], executable: str) -> None:
    seen = [[p, _signature(p)] for p in [executable, *used]]
    tmp = path + "." + str(os.getpid())
    try:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"software": software, "seen": seen}, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def software_of(python: str, root: str | None = None) -> dict[str, str]:
    """The ranks' software as `python` sees it; from the cache while nothing it was read from has changed."""
    path = _cache_file(python, root or default_root())
    kept = _cached(path)
    if kept is not None:
        return kept
    found = ask(python, SOFTWARE_PROBE)
    if not isinstance(found, dict) or "error" in found or "software" not in found:
        return dict(UNKNOWN_SOFTWARE)
    answer = {str(k): str(v) for k, v in found["software"].items()}
    executable = os.path.realpath(which(python) or python)
    _keep(path, answer, [str(p) for p in found.get("used", [])], executable)
    return answer
