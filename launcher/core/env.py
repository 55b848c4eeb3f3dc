"""The per-rank environment contract (DESIGN.md), `-x` exports, secret redaction and `--ranks` (pure)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence

from launcher.core.devices import RankDevices
from launcher.core.envsize import check_size
from launcher.core.plan import Plan, Slot
from launcher.core.rendezvous import Rendezvous
from launcher.errors import UsageError

HOROVOD_NAMES = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
)
# Rank identity: distrun computes these for every rank and nothing (host env, -x) may replace them,
# because one stale RANK would silently turn the job into two jobs that each wait forever.
OWNED_NAMES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "LOCAL_SIZE",
        "CROSS_RANK",
        "CROSS_SIZE",
        "TF_CONFIG",
        # horovodrun's rank identity, which Horovod scripts and collectives read (cross: Plan.horovod_cross).
        *HOROVOD_NAMES,
    }
)
# How many GPUs the launcher gave a rank of its own (--gpus-per-rank). The worker library reads it under the
# same name (collectives.placement.OWN_GPUS_VAR, a copy: the launcher never imports the worker library, and
# tests/unit/test_env.py holds the two equal).
OWN_GPUS_VAR = "DISTRUN_OWN_GPUS"
# Only the TORCHELASTIC_*/DISTRUN_* names distrun sets: others (torchrun's TORCHELASTIC_USE_AGENT_STORE) are
# leftovers that distrun drops (launcher/core/forward.py) and that `-x` may set on purpose.
CONTRACT_NAMES = frozenset(
    {
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "DISTRUN_RUN_ID",
        "DISTRUN_HOSTNAME",
        "DISTRUN_RESTART_COUNT",
    }
)
_OPTION_FOR = {"MASTER_ADDR": "--master-addr", "MASTER_PORT": "--master-port"}

# Set "unless set": the host's own environment wins over these, so they travel apart (see rank_env).
DEFAULTED_NAMES = frozenset(
    {
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)

# Anywhere in the name (AWS_SECRET_ACCESS_KEY, HF_TOKEN, db_password, GIT_CREDENTIALS) ...
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# ... or as a whole `_`-separated word, since they are also parts of harmless words (PATH, AUTHOR, PASSES).
SECRET_WORDS = frozenset({"PAT", "AUTH", "AUTHORIZATION", "PASS", "PW", "PWD"})
REDACTED = "<redacted>"
# The password in `scheme://user:password@host` (HTTPS_PROXY, database and git URLs), whatever the name.
# A match starts only where a run of scheme characters does (the lookbehind): tried at every letter of a long
# run, as written first, the scheme consumed the rest of the run each time, and a 128 KB `-x` value took
# distrun 27 s of CPU per look. The run's leading digits and signs are kept in the first group.
_URL_PASSWORD_RE = re.compile(
    r"(?<![A-Za-z0-9+.-])([0-9+.-]*[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):([^/\s@]*)@"
)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# 18 digits at most: int() refuses a number of over 4,300 (a rank past the world is refused later, by name).
_RANK_RE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?\Z")


def is_owned(name: str) -> bool:
    """True for the rank-identity variables that only distrun sets."""
    return name in OWNED_NAMES or name in CONTRACT_NAMES


def check_name(name: str, where: str) -> None:
    """Refuse a name `-x` or `--env-file` cannot set; `where` is `-x` or `FILE:LINE`."""
    if not _NAME_RE.match(name):
        shown, hidden = _bad_name(name)
        rest = "; the rest is not shown, it may be a value: write NAME=VALUE" if hidden else ""
        raise UsageError(f"{where}: {shown!r} is not a valid environment variable name{rest}")
    if is_owned(name):
        hint = f"use {_OPTION_FOR[name]}" if name in _OPTION_FOR else "it is part of each rank's identity"
        raise UsageError(f"{where} {name}: distrun sets {name} for every rank; {hint}")


def _bad_name(name: str) -> tuple[str, bool]:
    """A bad name as messages may show it, and whether some was hidden: never past a blank or a colon, which
    read as a mistyped `=` (`API_TOKEN: sk-live-...`), so what follows them may be a value."""
    end = next((i for i, c in enumerate(name) if c.isspace() or c == ":"), len(name))
    if end + 1 >= len(name):
        return name, False
    return name[: end + 1] + "...", True


def is_secret(name: str, patterns: Sequence[str] = ()) -> bool:
    """True when the name suggests a credential (HF_TOKEN, GITHUB_PAT, ...) or matches a --redact glob."""
    upper = name.upper()
    if any(marker in upper for marker in SECRET_MARKERS) or not SECRET_WORDS.isdisjoint(upper.split("_")):
        return name != "PWD"  # the shell's working directory, the one PWD that is no password
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


def redact_value(value: str) -> str:
    """The value with passwords inside URLs replaced."""
    return _URL_PASSWORD_RE.sub(rf"\1:{REDACTED}@", value)


def url_passwords(value: str) -> list[str]:
    """The passwords inside URLs in `value` (what `redact_value` replaces)."""
    return [match.group(2) for match in _URL_PASSWORD_RE.finditer(value)]


def redact(env: Mapping[str, str], patterns: Sequence[str] = ()) -> dict[str, str]:
    """A copy safe to print or log: secret-looking values and passwords in URLs are replaced.

    `patterns` are the user's `--redact` globs (case-insensitive) for names the rule would miss.
    """
    return {
        name: REDACTED if is_secret(name, patterns) else redact_value(value) for name, value in env.items()
    }


def join_host_port(host: str, port: int | str) -> str:
    """`host:port`, with IPv6 addresses bracketed so the port stays unambiguous."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def tf_workers(plan: Plan, rdzv: Rendezvous) -> tuple[str, ...]:
    """TF_CONFIG's worker list in rank order, one `addr:port` per rank."""
    if len(rdzv.node_addrs) != plan.node_count or len(rdzv.tf_ports) != plan.node_count:
        raise ValueError(
            f"rendezvous lists {len(rdzv.node_addrs)} node addresses for {plan.node_count} nodes"
        )
    workers = tuple(
        join_host_port(rdzv.node_addrs[slot.node_rank], rdzv.tf_ports[slot.node_rank][slot.local_rank])
        for slot in plan.slots
    )
    if len(set(workers)) != len(workers):
        raise ValueError(f"TF_CONFIG workers must have distinct ports: {workers}")
    return workers


def tf_config(workers: Sequence[str], index: int) -> str:
    """The TF_CONFIG value for the worker at `index` (its global rank)."""
    config = {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}
    return json.dumps(config, separators=(",", ":"))


def horovod_env(slot: Slot, plan: Plan) -> dict[str, str]:
    """horovodrun's variables for one rank, added to `rank_env`'s contract by `start_requests` (torchrun's
    contract stays as torchrun has it); an elastic reset sends the same values again."""
    cross_rank, cross_size = plan.horovod_cross(slot)
    values = (
        slot.rank,
        plan.world_size,
        slot.local_rank,
        plan.local_size(slot.node_rank),
        cross_rank,
        cross_size,
        slot.host.name,
    )
    return {name: str(value) for name, value in zip(HOROVOD_NAMES, values, strict=True)}


def rank_env(
    slot: Slot,
    plan: Plan,
    rdzv: Rendezvous,
    *,
    run_id: str,
    ifname: str | None,
    workers: Sequence[str] | None = None,
    restart_count: int = 0,
    max_restarts: int = 0,
    devices: RankDevices | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """One rank's (contract, defaults), the variables distrun sets for it.

    The contract (rank identity, rendezvous, run id, the rank's own devices) is applied over everything else;
    the defaults only where the rank's environment (its host's, then what travels to every rank) does not
    name the variable. Only the agent sees a host's environment, so it decides "unless set", once, for every
    host alike (launcher.agent.environment.rank_environment). `workers` is `tf_workers(plan, rdzv)`, passed
    in by callers that build many ranks' env at once. `devices` is the rank's placement: its own
    CUDA_VISIBLE_DEVICES, and one OpenMP thread per bound core.
    """
    local_size = plan.local_size(slot.node_rank)
    defaults: dict[str, str] = {}
    if ifname is not None:
        defaults["GLOO_SOCKET_IFNAME"] = defaults["NCCL_SOCKET_IFNAME"] = ifname
    if devices is not None and devices.cores is not None:
        defaults["OMP_NUM_THREADS"] = str(len(devices.cores))
    elif local_size > 1:
        # Ranks that each start one thread per core would oversubscribe the host (torchrun does this too).
        defaults["OMP_NUM_THREADS"] = "1"
    defaults["PYTHONUNBUFFERED"] = "1"
    defaults["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    contract = {
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": rdzv.master_addr,
        "MASTER_PORT": str(rdzv.master_port),
        "NODE_RANK": str(slot.node_rank),
        "GROUP_RANK": str(slot.node_rank),
        "GROUP_WORLD_SIZE": str(plan.node_count),
        "ROLE_RANK": str(slot.rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "ROLE_NAME": "default",
        "LOCAL_SIZE": str(local_size),
        "CROSS_RANK": str(slot.node_rank),
        "CROSS_SIZE": str(plan.node_count),
        "TF_CONFIG": tf_config(tf_workers(plan, rdzv) if workers is None else workers, slot.rank),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "DISTRUN_RUN_ID": run_id,
        "DISTRUN_HOSTNAME": slot.host.name,
        "DISTRUN_RESTART_COUNT": str(restart_count),
    }
    if devices is not None and devices.gpus is not None:
        # The rank's own devices, whatever the host or -x said: those only chose which devices to hand out.
        contract["CUDA_VISIBLE_DEVICES"] = ",".join(devices.gpus)
        contract[OWN_GPUS_VAR] = str(len(devices.gpus))
    return contract, defaults


def worker_env(
    slot: Slot,
    plan: Plan,
    rdzv: Rendezvous,
    *,
    run_id: str,
    user_env: Mapping[str, str],
    exports: Mapping[str, str],
    ifname: str | None,
    restart_count: int = 0,
    max_restarts: int = 0,
    workers: Sequence[str] | None = None,
    devices: RankDevices | None = None,
) -> dict[str, str]:
    """What distrun sets for one rank over `user_env` (its host's environment) when `exports` travel to
    every rank: `rank_env` composed as the agent composes it, as one mapping (the contract's tables)."""
    contract, defaults = rank_env(
        slot, plan, rdzv, run_id=run_id, ifname=ifname, workers=workers, restart_count=restart_count,
        max_restarts=max_restarts, devices=devices,
    )  # fmt: skip
    env = {k: v for k, v in defaults.items() if k not in user_env and k not in exports}
    env.update({name: value for name, value in exports.items() if not is_owned(name)})
    env.update(contract)
    return env


def own_part(env: Mapping[str, str], shared: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that `shared` does not already give with the same value."""
    return {k: v for k, v in env.items() if shared.get(k) != v}


def parse_exports(
    values: Sequence[str], environ: Mapping[str, str], source: str = "-x", *, split_on_blanks: bool = False
) -> tuple[tuple[str, str], ...]:
    """Parse `-x VAR=VALUE` and `-x VAR` (VAR's value taken from `environ`) into (name, value) pairs.

    `source` names the option in messages: `-x`, `FILE:LINE: export` for a config file, or `DISTRUN_EXPORT`,
    whose value was `split_on_blanks` (so a word may be the rest of a value: it is never shown).
    """
    exports: dict[str, str] = {}
    previous = ""
    for item in values:
        name, equals, value = item.partition("=")
        # Messages name the variable, never its value: it may be a secret.
        check_name(name, source)
        if not equals:
            if name not in environ and previous and split_on_blanks:
                # Most likely the rest of the value before it, cut at a blank (DISTRUN_EXPORT is split on
                # blanks): not shown, since that value may be a secret.
                raise UsageError(
                    f"{source}: the word after {previous}=... is neither NAME=VALUE nor a variable set here; "
                    f"a value with blanks cannot go in {source} (use --env-file)"
                )
            if name not in environ:
                form = f"-x {name}=VALUE" if source == "-x" else f"{name}=VALUE"
                raise UsageError(f"{source} {name}: {name} is not set here; give its value as {form}")
            value = environ[name]
        previous = name if equals else ""
        if "\0" in value:
            raise UsageError(f"{source} {name}: the value contains a NUL byte")
        if name in exports:
            raise UsageError(f"{source} {name} is given twice")
        check_size(name, value, source)
        exports[name] = value
    return tuple(exports.items())


def parse_rank_filter(spec: str, world_size: int | None = None) -> frozenset[int]:
    """Parse `--ranks 0,2-3` into a set of ranks; every rank must be below `world_size` when given."""
    ranks: set[int] = set()
    for raw in spec.split(","):
        token = raw.strip()
        match = _RANK_RE.match(token)
        if not match:
            raise UsageError(f"--ranks {spec!r}: {token!r} is not a rank or a range like 2-5")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if last < first:
            raise UsageError(f"--ranks {spec!r}: the range {token!r} runs backwards")
        if world_size is not None and last >= world_size:
            raise UsageError(f"--ranks {spec!r}: rank {last} does not exist (ranks are 0..{world_size - 1})")
        ranks.update(range(first, last + 1))
    return frozenset(ranks)
