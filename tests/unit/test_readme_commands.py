"""README's two set-up commands stay true: CI runs README's test command verbatim (`.ci/run`), and the main
job's command runs the example README names."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quick_start_commands(readme: str) -> list[str]:
    """The indented commands of README's "Quick start" section, up to its first paragraph after them."""
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    python -m pip install")]


def test_readme_has_two_commands_the_main_job_and_the_tests() -> None:
    main_job, tests = quick_start_commands((REPO / "README.md").read_text())
    assert re.search(r"&& distrun -np \d+ examples/train\.py$", main_job)
    assert (REPO / "examples/train.py").is_file()
    assert re.search(r"&& python -m pytest\b", tests)


def test_ci_runs_readmes_test_command_verbatim() -> None:
    _, tests = quick_start_commands((REPO / "README.md").read_text())
    ci_lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert tests in ci_lines
