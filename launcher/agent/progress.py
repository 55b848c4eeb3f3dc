"""Ask a rank for its latest collectives (stdlib-only, Python 3.7; shipped with the agent).

Every Python rank the agent starts imports a second small hook beside the stack hook (`ANSWER_MODULE`, through
PYTHONWARNINGS as `launcher.agent.stackdump` does): a daemon thread that waits in `open()` on a FIFO in the
agent's dump directory, `<pid>.progress.pipe`. Waiting there holds no GIL and costs the rank nothing; a byte
written to it makes the thread answer with `<pid>.progress`, written whole: the records of
`collectives.progress` (each process set's last collective issued, agreed and done) where the rank uses
collectives, else torch's own flight recorder (`TORCH_FR_BUFFER_SIZE`, `TORCH_NCCL_TRACE_BUFFER_SIZE`) for a
script that uses torch.distributed directly, else nothing. The answer comes while the rank's main thread
waits in a collective, which releases the GIL. A rank without the thread (not Python, or started with -I)
has no reader on the FIFO: the ask fails at once and the rank goes without records.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from typing import Any

ANSWER_MODULE = "distrun_progresshook"
PIPE_SUFFIX = ".progress.pipe"
FILE_SUFFIX = ".progress"
# How long a gathering of stacks waits for the answers once every stack is in.
ANSWER_WAIT = 0.5


# `json` loads at the first answer, not at the rank's start (~9 ms of every rank's start-up, with `re`).
ANSWER_SOURCE = """\
import os, sys, threading

_where = os.environ.get("DISTRUN_STACK_DIR")


def _torch():
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    c10d = sys.modules.get("torch._C._distributed_c10d")
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    dump = getattr(c10d, "_dump_nccl_trace_json", None) or getattr(c10d, "_dump_fr_trace_json", None)
    backend = str(dist.get_backend())
    import json

    if dump is None or size.strip() in ("", "0"):
        return {"backend": backend, "note": "no trace: torch's flight recorder is off "
                "(TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE unset)"}
    return {"backend": backend, "trace": json.loads(dump(includeCollectives=True, onlyActive=False))}


def _answer():
    mine = sys.modules.get("collectives.progress")
    records = mine.snapshot().get("records") if mine is not None else None
    if records:
        return {"records": records}
    return {"records": records or [], "torch": _torch()}


def _serve(pipe):
    target = pipe[: -len(".pipe")]
    while True:
        try:
            fd = os.open(pipe, os.O_RDONLY)
        except InterruptedError:
            continue
        except OSError:
            return
        try:
            os.read(fd, 64)
        finally:
            os.close(fd)
        import json

        try:
            text = json.dumps(_answer())
        except Exception as error:
            text = json.dumps({"records": [], "error": "%s: %s" % (type(error).__name__, error)})
        try:
            with open(target + ".tmp", "w") as f:
                f.write(text)
            os.replace(target + ".tmp", target)
        except OSError:
            return


def _install():
    if not _where:
        return
    pipe = os.path.join(_where, "%d.progress.pipe" % os.getpid())
    try:
        os.mkfifo(pipe, 0o600)
    except OSError:
        return
    threading.Thread(target=_serve, args=(pipe,), name="distrun-progress", daemon=True).start()


_install()


class Never(Warning):
    "The category PYTHONWARNINGS names so that Python imports this module; nothing ever raises it."
"""


def answer_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}{FILE_SUFFIX}")


def ask(directory: str, pid: int, fresh: bool = False) -> bool:
    """Ask rank process `pid` to write its records; whether it listens. `fresh`: remove an earlier answer
    first, so that the one read next is this request's."""
    if fresh:
        with contextlib.suppress(OSError):
            os.unlink(answer_path(directory, pid))
    try:
        # Non-blocking: with no reader (no such thread) the open fails at once instead of waiting for one.
        fd = os.open(os.path.join(directory, f"{pid}{PIPE_SUFFIX}"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENOENT, errno.EACCES, errno.ENOTDIR):
            raise
        return False
    try:
        os.write(fd, b"?")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read(directory: str, pid: int) -> list[dict[str, Any]] | None:
    """The rank's last answer's records ([]: it has none), or None when it has not answered."""
    try:
        with open(answer_path(directory, pid)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return records_of(data)


def records_of(data: Any) -> list[dict[str, Any]] | None:
    """An answer's records: collectives' own, else made from torch's trace, else a note saying why none."""
    if not isinstance(data, dict):
        return None
    records = data.get("records")
    if isinstance(records, list) and records:
        return [r for r in records if isinstance(r, dict)]
    found = data.get("torch")
    if isinstance(found, dict):
        source = f"torch ({found.get('backend', '?')})"
        trace = found.get("trace")
        if isinstance(trace, dict):
            return [{"source": source, **r} for r in trace_records(trace)]
        return [{"source": source, "note": str(found.get("note") or "no trace")}]
    if data.get("error"):
        return [
            {"source": "collectives", "note": f"the rank could not tell its collectives: {data['error']}"}
        ]
    return []


def trace_records(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Records from torch's flight recorder dump (its JSON form), one per process group: its last collective
    enqueued (issued) and completed (done), numbered by torch's collective_seq_id and named as torch names
    them (`nccl:all_reduce`)."""
    names: dict[tuple[str, int], str] = {}
    for entry in trace.get("entries") or ():
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ["", ""]
        try:
            names[(str(group[0]), int(entry.get("collective_seq_id") or 0))] = str(
                entry.get("profiling_name")
            )
        except (TypeError, ValueError, IndexError):
            continue
    out: list[dict[str, Any]] = []
    for pg, status in sorted((trace.get("pg_status") or {}).items()):
        if not isinstance(status, dict):
            continue
        record: dict[str, Any] = {"process_set": int(pg) if str(pg).isdigit() else 0}
        for field, key in (("issued", "last_enqueued_collective"), ("done", "last_completed_collective")):
            try:
                seq = int(status.get(key) or -1)
            except (TypeError, ValueError):
                seq = -1
            name = names.get((str(pg), seq), "")
            kind = name.partition(":")[2] or name or "collective"
            record[field] = {"seq": seq, "kind": kind, "name": name} if seq > 0 else None
        out.append(record)
    return out


def summary(records: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A sample's few fields from a rank's records: the global set's (or the first) last issued and done."""
    if not records:
        return {}
    record = next((r for r in records if r.get("process_set") == 0 and "note" not in r), records[0])
    issued, done = record.get("issued") or {}, record.get("done") or {}
    out: dict[str, Any] = {}
    if "note" in record:
        return out
    out["collective_issued"] = int(issued.get("seq", 0) or 0)
    out["collective_done"] = int(done.get("seq", 0) or 0)
    if issued.get("name"):
        out["collective_name"] = str(issued["name"])
    if record.get("moving") is True:
        out["collective_moving"] = True
    return out
