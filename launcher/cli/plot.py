"""`distrun plot REPORT.json -o run.png`: the picture of a run (launcher.report.plot), for a bug report."""

from __future__ import annotations

from pathlib import Path

import click

_EPILOG = """\b
Examples:
  distrun -np 4 --report run.json train.py && distrun plot run.json -o run.png
  distrun plot run.json -o run.svg

\b
Needs matplotlib, an optional extra: pip install "distrun[plot]".
Exit codes: 0 written; 1 matplotlib is not installed; 2 the report is missing, not JSON or not a report,
or -o names no .png/.svg file.
"""


@click.command(name="distrun plot", context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.argument("report", metavar="REPORT.json")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="The picture: .png or .svg [default: REPORT with .png for .json].",
)
def plot_cli(report: str, output: str | None) -> int:
    """Draw one picture of a run from its --report: step rate, CPU, memory and GPU per rank over time, ranks
    coloured by host; restarts, resets and the start-up timeline marked; stragglers highlighted."""
    from launcher.report.plot import plot

    source = Path(report).expanduser()
    out = Path(output).expanduser() if output else source.with_suffix(".png")
    plot(source, out)
    click.echo(f"wrote {out}")
    return 0
