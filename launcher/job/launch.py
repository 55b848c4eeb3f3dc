"""A launch from start to end: the console and the watch, connecting to every host, the preflight, the job's
attempts (`launcher.job.run.Job`), and whatever ended it accounted for: the table, the summary, the report.

Nothing here is retried or restarted: that is the Job's. This module owns what lives exactly as long as
distrun does, and is closed in order whatever ends the run (links first, so every agent hears EOF).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from launcher.console.progress import progress_line
from launcher.console.relay import LogOptions, LogRelay
from launcher.core.config import LaunchConfig
from launcher.core.plan import build_plan
from launcher.diagnose.watch import JobWatch, WatchOptions, open_control
from launcher.errors import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_SIGINT,
    DistrunError,
    HostError,
    Interrupted,
    ReportWriteError,
)
from launcher.job.reachable import connect_reachable
from launcher.job.run import Job, job_loop
from launcher.report.account import Failure, build_report, format_account, report_text
from launcher.report.file import ReportSlot
from launcher.report.summary import summarize
from launcher.runtime.node import close_all
from launcher.signals import FORWARDED_SIGNALS, caught, signal_pipe

if TYPE_CHECKING:
    from launcher.workdir.files import Workdir

log = logging.getLogger(__name__)


def launch(config: LaunchConfig, out_fd: int = 1, err_fd: int = 2) -> int:
    """Run the job to its end; returns distrun's exit code. Raises DistrunError before anything started."""
    plan = build_plan(config.plan_inputs)
    # Before anything starts anywhere: a bad --output-dir is bad input, not a failed job.
    relay = LogRelay(out_fd, err_fd, {s.rank: s.host.name for s in plan.slots}, LogOptions.of(config))
    # Before connecting anywhere: a workdir that is too big, or lacks the script, is refused here.
    workdir: Workdir | None = None
    if config.workdir is not None:
        from launcher.workdir.account import scan_for_launch

        workdir = scan_for_launch(config.workdir, config.workdir_limit, config.command)
    job: Job | None = None
    exit_code = EXIT_INTERNAL
    error: Failure | None = None  # what ended the run before (or instead of) an outcome
    final: str | None = None  # the job's outcome
    perf: dict[str, Any] | None = None  # --preflight's figures, for --report
    watch = JobWatch(relay, WatchOptions.of(config), open_control())
    slot: ReportSlot | None = None
    try:
        # From here the run has started: the earlier run's report goes, and this one's room is held.
        slot = ReportSlot(config.report) if config.report is not None else None
        # The first connections open before signals are redirected: Ctrl-C interrupts the handshakes at once.
        # A SIGUSR1/SIGUSR2 meanwhile has no rank to reach, and its default action would end distrun. (A
        # handler, not SIG_IGN: an ignored signal would stay ignored in every process started from here.)
        for signum in caught(FORWARDED_SIGNALS):
            signal.signal(signum, lambda *_: None)
        with progress_line(sys.stderr) as line:
            hook = watch.timeline.hook(line, time.monotonic)
            plan, nodes, unreachable = connect_reachable(
                config, plan, hook, control=watch.control, note=relay.note
            )
        watch.timeline.connected((node.name for node in nodes), time.monotonic())
        with signal_pipe() as wake_fd:
            # --timeout counts from here, the preflight included: one deadline, the loop's.
            loop = job_loop(config, wake_fd, control=watch.control)
            left_out = [(name, f"unreachable at the start ({why})") for name, why in unreachable]
            if config.preflight:
                from launcher.check.preflight import preflight

                measured = [node.name for node in nodes]
                plan, nodes, perf = preflight(config, plan, nodes, loop)
                kept = {node.name for node in nodes}
                left_out += [(name, "named by --preflight") for name in measured if name not in kept]
            job = Job(config, relay, loop, nodes, workdir, watch=watch)
            for name, why in left_out:
                job.pool.leave_out(name, why)
            try:
                with job.heartbeat:
                    outcome = job.run(plan)
            finally:
                # Whatever ended the job, once ranks ran: the account as a table.
                if job.accounts and len(job.accounts[-1].ranks) > 1:
                    relay.note(format_account(job.accounts[-1].ranks).splitlines())
            relay.note(
                summarize(outcome, relay.stderr_tail) + job.missing_file_lines(outcome) + job.closing_lines()
            )
            if job.give_up is not None and job.give_up.below_min_np:
                raise HostError(job.give_up.message or "too few ranks left")
            exit_code, final = outcome.exit_code, outcome.name
            return exit_code
    except DistrunError as err:
        exit_code, error = err.exit_code, Failure(None, getattr(err, "host", None), str(err))
        perf = getattr(err, "perf", perf)  # --preflight's figures, when it named the hosts that ended it
        raise
    except KeyboardInterrupt:
        exit_code, error = EXIT_SIGINT, Failure(None, None, str(Interrupted("SIGINT", EXIT_SIGINT)))
        raise
    finally:
        # Links first: whatever happens to the console or the log files, the agents must hear EOF.
        try:
            if job is not None:
                close_all(list(job.nodes.values()))
        except KeyboardInterrupt:
            # Ctrl-C while the agents end (they heard EOF already): no more waiting, and the job's own exit
            # code and report stand; the agents stop whatever is left when this process is gone.
            if error is None and final is None:
                raise
        finally:
            watch.close()
            relay.close()
            if slot is not None:
                # Every run given --report writes it, whatever ended it: no earlier run's report stays.
                _write_report(config, job, exit_code, error, final, slot=slot, perf=perf)


def _write_report(
    config: LaunchConfig,
    job: Job | None,
    exit_code: int,
    error: Failure | None,
    outcome: str | None,
    *,
    slot: ReportSlot,
    perf: dict[str, Any] | None = None,
) -> None:
    assert config.report is not None
    workdir = None
    if job is not None and job.workdir is not None:
        from launcher.workdir.account import workdir_record

        workdir = workdir_record(job.workdir, job.synced)
    watch = job.watch if job is not None else None
    report = build_report(
        run_id=job.run_id if job is not None else os.urandom(6).hex(),
        command=config.command,
        exit_code=exit_code,
        attempts=job.accounts if job is not None else [],
        failure=(job.failure if job is not None else None) or error,
        outcome=outcome,
        workdir=workdir,
        stacks=watch.dumps if watch is not None else (),
        stragglers=watch.named if watch is not None else (),
        timeline=watch.timeline.to_json() if watch is not None else (),
        perf=perf,
        # t = 0 of the timeline and the samples, on the wall clock (`distrun plot` places attempts by it)
        origin=time.time() - (time.monotonic() - watch.timeline.start) if watch is not None else None,
        resets=[r.to_json() for r in job.resets] if job is not None and config.restart.elastic else None,
    )
    try:
        slot.write(report_text(report))
    except (OSError, DistrunError) as err:
        said = f"cannot write the report {config.report}: {getattr(err, 'strerror', None) or err}"
        # A job that succeeded must not exit 0 without the report asked for; a failed one keeps its own code,
        # which says more. Either way no report is under the name (ReportSlot removed the earlier one).
        if outcome is not None and exit_code == EXIT_OK:
            raise ReportWriteError(said) from None
        log.error("%s", said)
