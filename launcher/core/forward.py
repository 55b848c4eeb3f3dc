"""Which of the launcher's environment travels to every rank, and `--env-file` (pure; only reads the file).

Every rank, local or remote, starts from the launcher's environment minus two kinds of variables:

* the deny-list (`is_denied`): variables that describe this one machine, login, shell or terminal. A remote
  rank keeps its own host's value (its SSH login sets HOME, USER, SSH_CONNECTION, ...); a local rank keeps
  this machine's, which is its own.
* leftovers (`is_leftover`): variables a previous launcher left behind that would make a worker believe it
  belongs to another job. They are removed from every rank, local ones included, and distrun's contract sets
  its own values where it has them.

Then `--env-file` adds or overrides, then `-x`; both may name any variable except distrun's rank identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.core.env import OWNED_NAMES, check_name
from launcher.core.envsize import check_size, over_limit
from launcher.errors import UsageError

# Deny-list: family -> (exact names, name prefixes), each with the reason it must not travel.
DENIED: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    # This machine's name: a rank on host b that reads HOSTNAME=a would mislabel its logs and checkpoints.
    "host": (frozenset({"HOSTNAME", "HOST"}), ()),
    # The login on this machine: the remote login sets its own, and HOME/USER may differ per host.
    "login": (
        frozenset({"HOME", "USER", "LOGNAME", "USERNAME", "SHELL", "MAIL", "KRB5CCNAME", "XAUTHORITY"}),
        (),
    ),
    # This shell's state: PWD names a directory of this shell (ranks get the launch directory as their cwd);
    # exported bash functions (environment modules' BASH_FUNC_module%%) break other shells.
    "shell": (
        frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PROMPT_COMMAND"}),
        ("BASH_FUNC_",),
    ),
    # This terminal: ranks write to pipes, and terminal sizes or colour settings would only garble logs.
    "terminal": (
        frozenset(
            {"TERM", "COLORTERM", "COLUMNS", "LINES", "LS_COLORS", "DISPLAY", "WAYLAND_DISPLAY", "STY"}
        ),
        ("TERM_", "TMUX", "VTE_"),
    ),
    # This login session's sockets and agents (SSH_AUTH_SOCK, XDG_RUNTIME_DIR) exist on this machine only.
    "session": (
        frozenset({"DBUS_SESSION_BUS_ADDRESS", "SESSION_MANAGER", "GPG_AGENT_INFO", "MOTD_SHOWN"}),
        ("SSH_", "XDG_"),
    ),
    # Per-host scratch: schedulers point TMPDIR at a job directory that exists on this machine only.
    "scratch": (frozenset({"TMPDIR"}), ()),
    # This machine's network interfaces: eth0 here may be ens5 there; distrun probes each host's own.
    "interface": (frozenset({"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}), ()),
}

# Leftovers of another launcher: rank identities and agent settings that belong to an outer job.
# torchrun's and distrun's rank identity is among them: the contract sets distrun's own.
LEFTOVER_NAMES = OWNED_NAMES | frozenset(
    {
        # Horovod's gloo rendezvous (its rank identity is among OWNED_NAMES: distrun sets it).
        "HOROVOD_GLOO_RENDEZVOUS_ADDR",
        "HOROVOD_GLOO_RENDEZVOUS_PORT",
        # MPICH's per-rank variables.
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    }
)
# TORCHELASTIC_USE_AGENT_STORE=True (left by torchrun) makes every rank wait for a store nobody serves;
# OpenMPI/PMI rank variables make DeepSpeed's MPI discovery take the outer job's ranks.
LEFTOVER_PREFIXES = ("TORCHELASTIC_", "DISTRUN_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MV2_COMM_WORLD_")

# Any of these in the launcher's environment means distrun itself runs inside another launcher's rank.
OUTER_LAUNCH_MARKERS = ("RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "DISTRUN_RUN_ID", "OMPI_COMM_WORLD_RANK")


def _matches(name: str, names: frozenset[str], prefixes: tuple[str, ...]) -> bool:
    return name in names or name.startswith(prefixes)


def denied_family(name: str) -> str | None:
    """The deny-list family `name` belongs to, or None when it may travel."""
    for family, (names, prefixes) in DENIED.items():
        if _matches(name, names, prefixes):
            return family
    return None


def is_leftover(name: str) -> bool:
    """True for variables another launcher leaves in its workers' environment."""
    return _matches(name, LEFTOVER_NAMES, LEFTOVER_PREFIXES)


def outer_launch(environ: Mapping[str, str]) -> str | None:
    """The variable showing that this launcher runs inside another launcher's rank, if any."""
    return next((name for name in OUTER_LAUNCH_MARKERS if name in environ), None)


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that travels to every rank.

    Any name an environment can hold travels (`GRÜSS`, `my.var`, `X-Y`: a local rank inherits them, so a
    remote one gets them too); bash's exported functions are deny-listed. A variable too large for any
    process to be given (launcher.core.envsize) stays behind, as job_env keeps it from local ranks.
    """
    return {
        name: value
        for name, value in environ.items()
        if _legal(name)
        and denied_family(name) is None
        and not is_leftover(name)
        and not over_limit(name, value)
    }


def _legal(name: str) -> bool:
    """What execve takes as a variable's name: anything but `=` and NUL (the value may hold `=`)."""
    return bool(name) and "=" not in name and "\0" not in name


def dropped_here(environ: Mapping[str, str], explicit: Iterable[str] = ()) -> tuple[str, ...]:
    """Names to remove from the environment of ranks on this machine, which otherwise inherit them.

    Leftovers always go; the interface names go too when an outer launch set them (distrun sets them in its
    own ranks, so a nested launch would otherwise pin every rank to the outer job's interface).
    `explicit` names (-x, --env-file) are the user's word and stay.
    """
    keep = set(explicit)
    outer = outer_launch(environ) is not None
    return tuple(
        sorted(
            name
            for name in environ
            if name not in keep and (is_leftover(name) or (outer and denied_family(name) == "interface"))
        )
    )


# Besides the deny-list, what a login on a host sets for itself (a remote rank gets its login's), and so what
# a rank on this machine keeps of this environment under --no-forward-env: the command search path and locale.
LOGIN_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ"})
LOGIN_PREFIXES = ("LC_",)


def login_variable(name: str) -> bool:
    """True for what a login on a host sets itself: the deny-list, PATH and the locale."""
    return denied_family(name) is not None or _matches(name, LOGIN_NAMES, LOGIN_PREFIXES)


def travelling_env(
    environ: Mapping[str, str],
    *,
    forward: bool,
    env_file: Iterable[tuple[str, str]] = (),
    exports: Iterable[tuple[str, str]] = (),
) -> dict[str, str]:
    """What every rank gets beneath distrun's contract: forwarded, then --env-file, then -x."""
    env = forwarded(environ) if forward else {}
    env.update(env_file)
    env.update(exports)
    return env


@dataclass(frozen=True)
class JobEnv:
    """The environment side of a launch, computed once for every rank.

    `travelling`: what every rank starts from (StartRequest.env), the user's word (--env-file, then -x) last;
    `unset`: removed from ranks on this machine (leftovers of another launcher; with --no-forward-env, all
    but its login variables).
    """

    travelling: dict[str, str]
    unset: tuple[str, ...]


# Set in a rank started by an elastic reset (a newcomer): collectives.elastic.joining reads it.
JOINED_VAR = "DISTRUN_JOINED_AT_RESET"


def joined_env(env: JobEnv) -> JobEnv:
    """The environment of a reset's newcomers: the job's, marked as joined at a reset."""
    return replace(env, travelling={**env.travelling, JOINED_VAR: "1"})


def job_env(
    environ: Mapping[str, str],
    *,
    forward: bool,
    env_file: Iterable[tuple[str, str]],
    exports: Iterable[tuple[str, str]],
) -> JobEnv:
    env_file, exports = tuple(env_file), tuple(exports)
    explicit = {**dict(env_file), **dict(exports)}
    # What no process can be given goes from local ranks too (the agent, distrun's child, would pass it on).
    unset = tuple(
        sorted({*dropped_here(environ, explicit), *(n for n, v in environ.items() if over_limit(n, v))})
    )
    if not forward:
        # A rank on this machine would otherwise inherit all of it from the agent, a child of distrun: keep
        # only what a login here would give it, as a remote rank gets its own login's.
        unset = tuple(sorted({*unset, *(n for n in environ if n not in explicit and not login_variable(n))}))
    return JobEnv(
        travelling=travelling_env(environ, forward=forward, env_file=env_file, exports=exports),
        unset=unset,
    )


def parse_env_file(path: Path, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Parse `KEY=VALUE` lines (`#` comment lines, blank lines, `KEY` alone takes this shell's value).

    Blanks around `=` are ignored; a value in matching single or double quotes loses them (keep blanks that
    way); nothing else is interpreted (no `$` expansion, no escapes), so the value is what the file says.
    Errors start with `PATH:LINE:` and never show a value.
    """
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read env file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read env file {path}: it is not UTF-8 text") from None
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, equals, value = line.partition("=")
        name, value = name.strip(), value.strip()
        check_name(name, where)
        if not equals:
            if name not in environ:
                raise UsageError(f"{where}: {name} has no value and is not set here; write {name}=VALUE")
            value = environ[name]
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if name in values:
            raise UsageError(f"{where}: {name} is already set at line {lines[name]}")
        if "\0" in value:
            raise UsageError(f"{where}: {name}: the value contains a NUL byte")
        check_size(name, value, f"{where}:")
        values[name], lines[name] = value, number
    return tuple(values.items())
