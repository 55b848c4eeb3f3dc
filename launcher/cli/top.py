"""`distrun top`: a live table of your running job's ranks, from another terminal.

It finds the job as `distrun stacks` does (the control socket of launcher.runtime.control) and asks it once a
second; the job answers in every phase with what it knows (launcher.diagnose.live). On a terminal the table
is redrawn in place (the alternate screen, raw mode, both restored on exit) until `q`; `--once` prints one
table, `--once --json` one JSON object per rank. Only click is imported at start-up: the rest loads when the
command runs.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator, Mapping

import click

REFRESH = 1.0  # seconds between tables
_QUIT_KEYS = (b"q", b"Q", b"\x03", b"\x04")  # q, Ctrl-C and Ctrl-D (raw mode: no signal for Ctrl-C)

_EPILOG = """\b
Examples:
  distrun top                    the table, refreshed every second; q quits
  distrun top --once             one table
  distrun top --once --json      one JSON object per rank, one per line

\b
A program named top (the Unix one) runs on every rank as any command does, after `--`:
  distrun -np 2 -- top -b -n 1

\b
Exit codes: 0 shown; 1 no such running job; 2 several jobs run (name one with --job) or bad input;
124 the job did not answer within --wait.
"""


@click.command(name="distrun top", context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.option("--job", "pid", type=click.IntRange(min=1), metavar="PID", help="Which job, when several run.")
@click.option("--once", is_flag=True, help="Print one table and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: one JSON object per rank, one per line.")
@click.option(
    "--wait", type=float, default=5.0, show_default=True, metavar="SECONDS", help="Give up after SECONDS."
)
def top_cli(pid: int | None, once: bool, as_json: bool, wait: float) -> int:
    """Show your running distrun job live: one row per rank, grouped by host (state, step rate, CPU, memory,
    GPU utilisation and memory, seconds since its last output), each host's totals, stragglers and stopped
    or silent ranks marked. The job goes on untouched."""
    from launcher.console.writer import use_color
    from launcher.errors import UsageError
    from launcher.runtime.control import ask_top, find_job

    if as_json and not once:
        raise UsageError("top: --json goes with --once (one object per rank, once)")
    if not (wait > 0):
        raise UsageError(f"top: --wait must be a positive number of seconds, got {wait:g}")
    pid = find_job(pid, "top --job")
    if once:
        document = ask_top(pid, wait)
        if as_json:
            import json

            for row in _ranks(document):
                click.echo(json.dumps(row))
        else:
            click.echo("\n".join(_screen(document, use_color(None), None)))
        return 0
    if sys.stdin.isatty() and sys.stdout.isatty():
        return _live(pid, wait, use_color(None))
    return _lines(pid, wait)


def _ranks(document: Mapping[str, object]) -> list[Mapping[str, object]]:
    rows = document.get("ranks")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _screen(document: Mapping[str, object], color: bool, size: os.terminal_size | None) -> list[str]:
    from launcher.diagnose.top_view import heading, table

    width = size.columns if size is not None else None
    lines = [heading(document)[: width - 1] if width else heading(document)]
    error = document.get("error")  # the job's live view failed (the job runs on)
    if isinstance(error, str):
        lines.append(error)
    rows = _ranks(document)
    if rows:
        shown = table(rows, color=color, width=width)
        if size is not None and len(shown) + 2 > size.lines:
            hidden = len(shown) + 3 - size.lines
            shown = [*shown[: size.lines - 3], f"... {hidden} more lines (a taller terminal shows them)"]
        lines += ["", *shown]
    return lines


def _lines(pid: int, wait: float) -> int:
    """Off a terminal: a table every second, one after another, until the job ends."""
    from launcher.runtime.control import NoJob, ask_top

    while True:
        try:
            document = ask_top(pid, wait)
        except NoJob:
            click.echo(f"distrun top: job {pid} ended")
            return 0
        click.echo("\n".join([*_screen(document, False, None), ""]))
        time.sleep(REFRESH)


@contextlib.contextmanager
def _raw_terminal() -> Iterator[int]:
    """Raw mode on stdin and the alternate screen without a cursor; both restored however it ends."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    out = sys.stdout
    out.write("\x1b[?1049h\x1b[?25l")
    out.flush()
    try:
        yield fd
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live(pid: int, wait: float, color: bool) -> int:
    from launcher.runtime.control import NoJob, ask_top

    ended = False
    with _raw_terminal() as keys:
        while True:
            try:
                document = ask_top(pid, wait)
            except NoJob:
                ended = True
                break
            size = os.get_terminal_size(sys.stdout.fileno())
            lines = [*_screen(document, color, size), "", "q quits"]
            # Raw mode: no newline translation, so each line ends in \r\n; \x1b[K clears what was longer.
            sys.stdout.write("\x1b[H" + "".join(f"{line}\x1b[K\r\n" for line in lines) + "\x1b[J")
            sys.stdout.flush()
            if _quit_within(keys, REFRESH):
                break
    if ended:
        click.echo(f"distrun top: job {pid} ended")
    return 0


def _quit_within(fd: int, seconds: float) -> bool:
    """Whether a quit key is pressed within `seconds` (other keys are read and ignored)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            return False
        key = os.read(fd, 32)
        if not key or any(k in key for k in _QUIT_KEYS):
            return True
    return False
