"""`--cpu-durations N`: the N tests that took the most CPU, counting every process each one started.

On a two-core machine the suite is bound by CPU, not by waiting: a test's CPU is what it takes from every
other test beside it, and wall durations (`--durations`) cannot tell a test that waits from one that burns.
Each pytest process (a serial run, or each xdist worker) moves itself into a cgroup of its own, which every
process it starts inherits: distrun, its agents and ranks, and the sessions of the simulated hosts' sshd and
slurmd that its fixtures started. A test's CPU is that group's usage from its start to its end (setup and
teardown included, so a module's cluster is counted to its first test). It needs a cgroup to write to
(root, or a delegated one); without one it says so once and counts nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from pathlib import Path

import pytest

_KEY = "cpu_s"
_START = pytest.StashKey[float]()


class _Group:
    """A cgroup holding this process: v2 (`cpu.stat`'s usage_usec) or v1's cpuacct (`cpuacct.usage`)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.usage = ""
        for parent, usage in _candidates():
            group = parent / f"distrun-tests-{os.getpid()}"
            try:
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                with contextlib.suppress(OSError):
                    group.rmdir()
                continue
            self.path, self.usage = group, usage
            return

    def seconds(self) -> float:
        assert self.path is not None
        text = (self.path / self.usage).read_text()
        if self.usage == "cpuacct.usage":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def close(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(OSError):  # a daemon a fixture left running keeps the group: harmless
            (self.path.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.path.rmdir()


def _candidates() -> list[tuple[Path, str]]:
    """(this process's group, the file that counts its CPU) in each hierarchy that counts CPU, v2 first."""
    found: list[tuple[Path, str]] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, where = line.split(":", 2)
        if number == "0":
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (root / "cgroup.controllers").exists():
                    found.insert(0, (root / where.lstrip("/"), "cpu.stat"))
                    break
        elif "cpuacct" in controllers.split(","):
            found.append((Path("/sys/fs/cgroup/cpuacct") / where.lstrip("/"), "cpuacct.usage"))
    return found


class CpuTime:
    """The plugin: counts in each process that runs tests (its group made at its first test, so that an xdist
    controller makes none), reports in the one that prints."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.group: _Group | None = None
        self.spent: dict[str, float] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.group is None:
            self.group = _Group()
        if self.group.path is not None:
            item.stash[_START] = self.group.seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        # Before the teardown's report is made: it carries the test's properties to xdist's controller.
        if call.when == "teardown" and self.group is not None and _START in item.stash:
            item.user_properties.append((_KEY, self.group.seconds() - item.stash[_START]))
        return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            spent = dict(report.user_properties).get(_KEY)
            if isinstance(spent, float):
                self.spent[report.nodeid] = spent

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        total = sum(self.spent.values())
        terminalreporter.write_sep("=", f"most CPU: {len(self.spent)} tests counted, {total:.0f} s in all")
        if not self.spent:
            terminalreporter.write_line(
                "--cpu-durations: no cgroup to count in (needs root): nothing counted"
            )
        for nodeid, spent in sorted(self.spent.items(), key=lambda kv: -kv[1])[: self.count]:
            terminalreporter.write_line(f"{spent:8.2f}s cpu  {nodeid}")

    def pytest_unconfigure(self) -> None:
        if self.group is not None:
            self.group.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations", type=int, default=0, metavar="N",
        help="show the N tests that took the most CPU, every process they started counted (needs a cgroup)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--cpu-durations"):
        config.pluginmanager.register(CpuTime(config.getoption("--cpu-durations")), "cpu-durations")
