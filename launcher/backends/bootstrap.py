"""How an agent process is started: imported on this machine, shipped as source everywhere else.

A remote host needs no distrun install: its interpreter runs a small constant bootstrap that reads the sources
of the agent package's modules (`launcher/agent/`, every module in it) from stdin and runs the agent; the rest
of stdin is then the frame stream.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.agent import OLDEST_PYTHON

AGENT_DIR = Path(__file__).resolve().parents[1] / "agent"
# What a host without any of the interpreters tried says (`distrun check` tells it from SSH trouble).
NO_PYTHON = "distrun: no Python interpreter found here"
# What an interpreter older than the agent needs says, before the version it is.
TOO_OLD = "distrun: the agent needs Python"
CODE_CACHE_DAYS = 30
# The module whose main() an agent process runs: one that talks on its stdin/stdout, or one that dials home
# over TCP (an srun step's agents).
SERVER = "launcher.agent.server"
HOMING = "launcher.agent.homing"
# An agent imports its modules without the garbage collector (its passes over them were ~10 ms of every
# agent's start), then leaves what they made out of every later pass, as distrun does (launcher.without_gc).
_COLLECTOR_ON = "gc.freeze();gc.enable()"
_TOP_IMPORT = re.compile(rb"^from launcher\.agent\.(\w+) import", re.MULTILINE)


def shipped_modules(folder: Path = AGENT_DIR) -> tuple[str, ...]:
    """Every module of the agent's folder, each after those it imports at its top (the order the bootstrap
    reads them in; each runs at its first import). Read from the folder, so a new module there travels without
    a list to keep."""
    needs = {
        path.stem: set(_TOP_IMPORT.findall(path.read_bytes()))
        for path in folder.glob("*.py")
        if path.name != "__init__.py"
    }
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise RuntimeError(
                f"launcher/agent/: modules import each other at their top: {' -> '.join(path)}"
            )
        for need in sorted(needs[name]):
            visit(need.decode(), (*path, name))
        order.append(name)

    for name in sorted(needs):
        visit(name, ())
    return tuple(f"launcher.agent.{name}" for name in order)


def _shipped() -> tuple[str, ...]:
    """SHIPPED, read from the folder at its first use: a job on this machine alone ships nothing and never
    reads it (reading it is most of this module's import time)."""
    known: tuple[str, ...] | None = globals().get("SHIPPED")
    if known is None:
        known = globals()["SHIPPED"] = shipped_modules()
    return known


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "SHIPPED":  # every module of launcher/agent/, in the order the bootstrap runs them
        return _shipped()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bootstrap(entry: str = SERVER) -> str:
    """argv[1:] holds each shipped module's source length and digest (`len:digest`), in SHIPPED order; then
    `entry`'s main() runs.

    The modules are found under their real names, in the packages `launcher` and `launcher.agent`, so
    `from launcher.agent.protocol import ...` in the agent works as it does when imported here; each runs at
    its first import (a finder first on `sys.meta_path`), so an agent runs only the modules its job uses:
    an elastic job's, --workdir's or stack dumps' load when those are asked for, as they do here. Compiling
    them is a quarter of an agent's start, so each host keeps the compiled code per user, named by the
    source's digest and the interpreter's bytecode magic (a changed source or interpreter is simply another
    name); every failure there falls back to compiling, and a directory someone else could write to is not
    used. Files unused for CODE_CACHE_DAYS go when a new one is written. The same directory keeps the agent's
    records' compiled methods (launcher.agent.dataclass_code, installed before any record is made).
    """
    # `d` is launcher.agent.cache_root.private_code_dir(), restated: the bootstrap runs before any shipped
    # module exists (tests/integration/test_agent_caches.py holds the two to the same directory).
    from launcher.agent.cache_root import CACHE_DIR_VAR

    too_old = f"{TOO_OLD} {'.'.join(map(str, OLDEST_PYTHON))} or newer, not "
    return (
        # No collector until the agent's modules are in, then never over them (_COLLECTOR_ON).
        "import gc,os,sys,time,types,marshal\ngc.disable()\n"
        # An older interpreter would fail on the first module's syntax with a traceback: say it in one line.
        f"if sys.version_info<{OLDEST_PYTHON!r}:sys.exit({too_old!r}+sys.version.split()[0])\n"
        "def r(n):\n"
        " b=b''\n"
        " while len(b)<n:\n"
        "  c=os.read(0,n-len(b))\n"
        "  if not c:sys.exit(3)\n"
        "  b+=c\n"
        " return b\n"
        "try:\n"
        " import _frozen_importlib_external as e\n"
        f" d=os.path.join(os.environ.get({CACHE_DIR_VAR!r}) or os.path.join(os.environ.get('XDG_CACHE_HOME')"
        " or os.path.expanduser('~/.cache'),'distrun'),'code');t=e.MAGIC_NUMBER.hex()\n"
        " os.makedirs(d,0o700,exist_ok=True);s=os.stat(d)\n"
        " if s.st_uid!=os.getuid() or s.st_mode&0o22:d=None\n"
        "except Exception:d=None\n"
        "def k(q,a,s):\n"
        " f=d and os.path.join(d,q[9:]+'-'+a.split(':')[1]+'-'+t)\n"
        " try:\n"
        "  with open(f,'rb') as x:return marshal.loads(x.read())\n"
        " except Exception:pass\n"
        " c=compile(s,'distrun-'+q[9:],'exec')\n"
        " if f:\n"
        "  w=f+'.'+str(os.getpid())\n"
        "  try:\n"
        "   with open(w,'wb') as x:x.write(marshal.dumps(c))\n"
        "   os.replace(w,f)\n"
        "   for o in os.listdir(d):\n"
        "    o=os.path.join(d,o)\n"
        f"    if os.stat(o).st_atime<time.time()-{CODE_CACHE_DAYS}*86400:os.unlink(o)\n"
        "  except Exception:\n"
        "   try:os.unlink(w)\n"
        "   except OSError:pass\n"
        " return c\n"
        "p=types.ModuleType('launcher');p.__path__=[];sys.modules['launcher']=p\n"
        "g=types.ModuleType('launcher.agent');g.__path__=[];sys.modules['launcher.agent']=g;p.agent=g\n"
        # Every source is read now (the frames follow them on stdin); each module runs at its first import.
        f"c={{q:(a,r(int(a.split(':')[0]))) for q,a in zip({_shipped()!r},sys.argv[1:])}}\n"
        "from importlib.machinery import ModuleSpec\n"
        "class F:\n"
        " def find_spec(n,p=None,t=None):return ModuleSpec(n,F) if n in c else None\n"
        " def create_module(s):return None\n"
        " def exec_module(m):exec(k(m.__name__,*c.pop(m.__name__)),m.__dict__)\n"
        "sys.meta_path.insert(0,F)\n"
        # The records' methods from the same directory (launcher.agent.dataclass_code), before any is made.
        "h=__import__('launcher.agent.dataclass_code',fromlist=['install']);h.install(d,'agent')\n"
        f"try:\n m=__import__({entry!r},fromlist=['main']);{_COLLECTOR_ON}\n sys.exit(m.main())\n"
        "finally:h.save()\n"
    )


def shipped_sources() -> list[bytes]:
    """SHIPPED's sources, in its order: what the bootstrap reads from stdin."""
    return [(AGENT_DIR / f"{name[15:]}.py").read_bytes() for name in _shipped()]


def bootstrap_args(sources: Sequence[bytes], entry: str = SERVER) -> list[str]:
    """The interpreter's arguments (after its path) that run the shipped agent."""
    import hashlib  # only for hosts that are not this machine: a local job never imports it

    return [
        "-S",
        "-u",
        "-c",
        bootstrap(entry),
        *(f"{len(s)}:{hashlib.sha256(s).hexdigest()[:32]}" for s in sources),
    ]


def local_argv(python: str) -> list[str]:
    """The agent on this machine: imported from where the launcher lives, so its bytecode is reused.

    Shipping and compiling the source, as for remote hosts, would add ~15 ms to every local start.
    """
    home = str(AGENT_DIR.parents[1])
    code = (
        f"import gc, sys; gc.disable(); sys.path.insert(0, {home!r}); from {SERVER} import main; "
        f"{_COLLECTOR_ON}; sys.exit(main())"
    )
    return [python, "-S", "-u", "-c", code]


def agent_pythons(python: str | None) -> list[str]:
    """The interpreters to try for a remote agent, in order: --python, else ours where the host has it."""
    return [python] if python else [sys.executable, "python3"]


def remote_command(pythons: Sequence[str], sources: Sequence[bytes], entry: str = SERVER) -> str:
    """A POSIX shell command running the agent with the first of `pythons` that exists on the host.

    Everything in it is ours (interpreter paths and the bootstrap), quoted; user data never passes a shell.
    """
    tail = shlex.join(bootstrap_args(sources, entry))
    tries = " ".join(shlex.quote(p) for p in pythons)
    missing = shlex.quote(f"{NO_PYTHON} (tried {', '.join(pythons)})")
    return (
        f'for p in {tries}; do command -v "$p" >/dev/null 2>&1 && exec "$p" {tail}; done; '
        f"echo {missing} >&2; exit 127"
    )
