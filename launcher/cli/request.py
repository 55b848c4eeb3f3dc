"""Option values -> one validated `Request`: the `LaunchConfig` of a launch (or of `distrun check`), or only
its plan (`--dry-run`).

Every value is checked here, in one place, for the launch and `distrun check` alike; a bad one is a
UsageError naming the option as the user gave it (the flag, the DISTRUN_* variable or the --config line).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from launcher.backends import api as backend
from launcher.backends.api import Backend, FoundHosts
from launcher.backends.locality import refuse_this_machine_twice, runs_here
from launcher.cli.backend_options import backend_values
from launcher.cli.config_file import ENV_LEVEL, Sources
from launcher.core.blacklist import COOLDOWN_CEILING, COOLDOWN_FLOOR
from launcher.core.command import interpreter, resolve_command
from launcher.core.config import LaunchConfig, PrefixMode, RestartOptions
from launcher.core.devices import Placement
from launcher.core.env import parse_exports, parse_rank_filter
from launcher.core.forward import parse_env_file
from launcher.core.hosts import Host, parse_host_list, parse_hostfile
from launcher.core.plan import PlanInputs, build_plan, implicit_localhost
from launcher.errors import DeadlineReached, UsageError
from launcher.report.file import ReportPathError, check_room


@dataclass(frozen=True)
class Request:
    """What the command line asked for: a launch, or only its plan (`--dry-run`)."""

    config: LaunchConfig
    dry_run: bool
    verbose: int = 0


def given_hosts(values: Mapping[str, Any], sources: Sources) -> tuple[Host, ...] | None:
    """-H or --hostfile, whichever was given at the higher precedence level; both at one level is an error."""
    hosts, hostfile = values["hosts"], values["hostfile"]
    levels = sources.levels
    if hosts is not None and hostfile is not None:
        if levels["hosts"] == levels["hostfile"]:
            raise UsageError("use either -H/--hosts or --hostfile, not both")
        if levels["hosts"] > levels["hostfile"]:
            hostfile = None
        else:
            hosts = None
    if hosts is not None:
        return parse_host_list(hosts, sources.label("hosts", "-H"))
    if hostfile is not None:
        return parse_hostfile(Path(hostfile).expanduser())
    return None


def _output_dir(value: str | None, label: str) -> Path | None:
    """The directory may not exist yet (it is created at launch), but nothing on its path may be a file."""
    if value is None:
        return None
    path = Path(value).expanduser()
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f"{label} {value}: {part} is a file, not a directory")
    return path


def positive_seconds(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number of seconds, got {value:g}")
    return value


def _interval(value: float, option: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{option} must be zero or a positive number of seconds, got {value:g}")
    return value


def _word(value: str | None, option: str) -> str | None:
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise UsageError(f"{option} {value!r}: expected one word")
    return value


def _discovery_script(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"--host-discovery-script {value}: not an executable file")
    return path.resolve()


def _first_discovery(values: Mapping[str, Any]) -> tuple[Host, ...] | None:
    """An elastic job given a discovery script and no hosts starts on the hosts it lists (its first call: a
    failure ends the job before anything starts)."""
    script = _discovery_script(values["host_discovery_script"])
    if script is None or values["min_np"] is None:
        return None
    from launcher.job.discovery import TIMEOUT, DiscoveryError, DiscoveryOverran, discover

    limit = values["timeout"]
    if limit is not None and limit < TIMEOUT:  # --timeout bounds the whole job, this first call included
        try:
            hosts = discover(script, limit, slots_per_host=values.get("slots_per_host"))
        except DiscoveryOverran:
            raise DeadlineReached(
                f"timed out after {limit:g}s: --host-discovery-script {script} had not answered"
            ) from None
    else:
        hosts = discover(script, slots_per_host=values.get("slots_per_host"))
    if not hosts:
        raise DiscoveryError(f"--host-discovery-script {script}: its first call listed no hosts")
    return hosts


def _restart_options(values: Mapping[str, Any], num_proc: int, discovered: bool = False) -> RestartOptions:
    min_np, max_np = values["min_np"], values["max_np"]
    script = values["host_discovery_script"]
    slots_per_host = values.get("slots_per_host")
    if slots_per_host is not None and script is None:
        raise UsageError("--slots-per-host is for the hosts of --host-discovery-script; give one")
    reset_limit = values.get("reset_limit")
    elastic_timeout = values.get("elastic_timeout")
    cooldown = values.get("blacklist_cooldown_range")
    elastic_only = {
        "--max-np": max_np, "--reset-limit": reset_limit, "--host-discovery-script": script,
        "--elastic-timeout": elastic_timeout, "--blacklist-cooldown-range": cooldown,
    }  # fmt: skip
    given = next((name for name, value in elastic_only.items() if value is not None), None)
    if min_np is None and given is not None:
        raise UsageError(f"{given} makes the job elastic and needs --min-np")
    if min_np is not None:
        max_np = num_proc if max_np is None else max_np
        if not min_np <= num_proc <= max_np:
            raise UsageError(
                f"--min-np {min_np}, -np {num_proc} and --max-np {max_np} must satisfy min <= np <= max"
            )
    script = _discovery_script(script)
    max_restarts = values["max_restarts"]
    if max_restarts is None:
        max_restarts = 3 if min_np is not None else 0
    delay = values["restart_delay"]
    if not (math.isfinite(delay) and delay >= 0):
        raise UsageError(f"--restart-delay must be zero or a positive number of seconds, got {delay:g}")
    if elastic_timeout is not None:
        positive_seconds(elastic_timeout, "--elastic-timeout")
    return RestartOptions(
        max_restarts=max_restarts, delay=delay, min_np=min_np, max_np=max_np, discovery_script=script,
        reset_limit=reset_limit, slots_per_host=slots_per_host, discovered_first=discovered,
        cooldown_range=_cooldown_range(cooldown),
        elastic_timeout=600.0 if elastic_timeout is None else elastic_timeout,
    )  # fmt: skip


def _cooldown_range(given: tuple[int, int] | None) -> tuple[float, float] | None:
    """--blacklist-cooldown-range MIN MAX within Horovod's bounds (1 s to an hour)."""
    if given is None:
        return None
    low, high = given
    if not COOLDOWN_FLOOR <= low <= high <= COOLDOWN_CEILING:
        raise UsageError(
            f"--blacklist-cooldown-range {low} {high}: expected {COOLDOWN_FLOOR:g} <= MIN <= MAX <= "
            f"{COOLDOWN_CEILING:g} seconds"
        )
    return float(low), float(high)


def _exports(values: Mapping[str, Any], sources: Sources) -> tuple[tuple[str, str], ...]:
    """The file's exports, then the command line's (or DISTRUN_EXPORT's), which win name by name."""
    given = tuple(values["export"])
    in_file = sources.file_counts.get("export", 0)
    exports = dict(parse_exports(given[:in_file], os.environ, sources.file_labels.get("export", "-x")))
    from_env = sources.levels["export"] == ENV_LEVEL
    label = sources.label("export", "-x")  # DISTRUN_EXPORT (-x/--export) where it came from there
    exports.update(parse_exports(given[in_file:], os.environ, label, split_on_blanks=from_env))
    return tuple(exports.items())


def _report_path(value: str | None, label: str) -> Path | None:
    """Checked before the run, so that a long job does not end by failing to write its report."""
    if value is None:
        return None
    path = Path(value).expanduser()
    try:
        check_room(path)
    except ReportPathError as err:
        raise ReportPathError(str(err).replace("--report", label, 1)) from None
    return path


def _workdir(value: str | None, label: str) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UsageError(f"{label} {value}: not a directory")
    return path.resolve()


def _env_files(paths: Sequence[str], sources: Sources) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    in_file = sources.file_counts.get("env_file", 0)  # the config file's come first when both give some
    for index, path in enumerate(paths):
        try:
            merged.update(parse_env_file(Path(path), os.environ))
        except UsageError as err:
            # A file that cannot be read is named where it was given (`FILE:LINE: env-file`, a DISTRUN_*
            # variable); errors inside it already start with its own PATH:LINE.
            label = sources.file_labels.get("env_file") if index < in_file else sources.labels.get("env_file")
            if label is None or not str(err).startswith("cannot read env file"):
                raise
            raise UsageError(f"{label}: {err}") from None
    return tuple(merged.items())


def _redact_patterns(patterns: Sequence[str], label: str) -> tuple[str, ...]:
    for pattern in patterns:
        if not pattern.strip():
            raise UsageError(f"{label}: expected a variable name or glob such as 'MYCO_*'")
    return tuple(patterns)


def _found_hosts(
    chosen: Backend | None, backends: Sequence[Backend], options: Mapping[str, object]
) -> tuple[Backend | None, FoundHosts | None]:
    """Hosts from the environment when neither -H nor --hostfile gave any: the chosen backend's own source,
    else (when it borrows hosts) the first backend's that finds some; with no --launcher, the backend that
    found them is the one chosen."""
    if chosen is not None:
        found = chosen.find_hosts(os.environ, options.get(chosen.name))
        if found is not None or not chosen.borrows_hosts:
            return chosen, found
    for candidate in backends:
        if candidate is not chosen:
            found = candidate.find_hosts(os.environ, options.get(candidate.name))
            if found is not None:
                return chosen or candidate, found
    return chosen, None


def build_request(values: Mapping[str, Any], sources: Sources, backends: Sequence[Backend]) -> Request:
    if values["host_discovery_script"] is not None and values["min_np"] is None and values["num_proc"]:
        # horovodrun: a discovery script makes the job elastic, and its least size is -np unless --min-np.
        values = {**values, "min_np": values["num_proc"]}
    command = tuple(values["command"])
    resolve_command(command, interpreter(values["python"]))
    num_proc: int | None = values["num_proc"]
    oversubscribe = bool(values["oversubscribe"])
    hosts = given_hosts(values, sources)
    options = backend_values(backends, values, sources.label)
    launcher: str | None = values["launcher"]
    chosen = None if launcher is None else backend.get(launcher)
    if chosen is not None:
        chosen.check_options(hosts, os.environ)
    discovered = hosts is None and (hosts := _first_discovery(values)) is not None
    if hosts and values["min_np"] is not None and values["max_np"] is not None:
        # Horovod's elastic driver: the world takes every slot of its hosts (listed or discovered), up to
        # --max-np; -np is the least it starts with.
        num_proc = max(num_proc or 0, min(values["max_np"], sum(host.slots for host in hosts)))
    if hosts is None:
        chosen, found = _found_hosts(chosen, backends, options)
        if found is not None:
            hosts = found.hosts
            num_proc = num_proc or found.num_proc
    launcher = launcher or (chosen.name if chosen is not None else backend.DEFAULT)
    hosts = hosts or (implicit_localhost(num_proc, os.cpu_count() or 1, oversubscribe),)
    refuse_this_machine_twice(hosts, [runs_here(h) for h in hosts])
    plan = build_plan(PlanInputs(hosts, num_proc, oversubscribe))
    ranks = values["ranks"]
    placement = Placement(values["gpus_per_rank"], values["bind_cores"], values["numa_binding"])
    label = sources.label
    config = LaunchConfig(
        command=command,
        hosts=hosts,
        num_proc=plan.world_size,
        master_addr=_word(values["master_addr"], label("master_addr", "--master-addr")),
        master_port=values["master_port"],
        exports=_exports(values, sources),
        env_file=_env_files(values["env_file"], sources),
        forward_env=values["forward_env"],
        redact=_redact_patterns(values["redact"], label("redact", "--redact")),
        oversubscribe=oversubscribe,
        report=_report_path(values["report"], label("report", "--report")),
        prefix=cast(PrefixMode, values["prefix"]),
        timestamp=values["timestamp"],
        progress_interval=_interval(
            values["progress_interval"], label("progress_interval", "--progress-interval")
        ),
        output_dir=_output_dir(values["output_dir"], label("output_dir", "--output-dir")),
        console_ranks=None if ranks is None else parse_rank_filter(ranks, plan.world_size),
        timeout=None
        if values["timeout"] is None
        else positive_seconds(values["timeout"], label("timeout", "--timeout")),
        grace_period=positive_seconds(values["grace_period"], label("grace_period", "--grace-period")),
        stall_timeout=None
        if values["stall_timeout"] is None
        else positive_seconds(values["stall_timeout"], label("stall_timeout", "--stall-timeout")),
        startup_timeout=positive_seconds(
            values["startup_timeout"], label("startup_timeout", "--startup-timeout")
        ),
        stack_tool=values["stack_tool"],
        straggler_window=positive_seconds(
            values["straggler_after"], label("straggler_after", "--straggler-after")
        ),
        restart=_restart_options(values, plan.world_size, discovered),
        python=_word(values["python"], label("python", "--python")),
        network_interface=_word(
            values["network_interface"], label("network_interface", "--network-interface")
        ),
        gpus_per_rank=placement.gpus_per_rank,
        bind_cores=placement.bind_cores,
        numa_binding=placement.numa_binding,
        color=values["color"],
        backend_options=options,
        launcher=launcher,
        workdir=_workdir(values["workdir"], label("workdir", "--workdir")),
        workdir_limit=values["workdir_limit"] << 20,
        workdir_relay=values["workdir_relay"],
        allow_mismatch=values["allow_mismatch"],
        preflight=bool(values.get("preflight")),
        sample_interval=_interval(values["sample_interval"], label("sample_interval", "--sample-interval")),
    )
    return Request(config=config, dry_run=values["dry_run"], verbose=values["verbose"] or 0)
