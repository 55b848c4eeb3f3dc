"""Bad input, run as the real `distrun` process: exit 2, one line on stderr, no traceback, nothing started."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import clean_env, run_distrun

# Writes its first argument; if the file exists afterwards, distrun started a worker.
WORKER = (sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()")


@dataclass(frozen=True)
class Case:
    """`{tmp}` in args, files, env and expected stands for the test's tmp_path."""

    args: tuple[str, ...]
    expected: str
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    command: bool = True


HOSTFILE = ("--hostfile", "{tmp}/hosts")

CASES = {
    "H-slots-not-a-number": Case(("-H", "a:x"), "-H entry 'a:x': slots must be a positive integer, got 'x'"),
    "H-zero-slots": Case(("-H", "a:2,b:0"), "-H entry 'b:0': slots must be a positive integer, got '0'"),
    "H-negative-slots": Case(("-H", "a:-1"), "got '-1'"),
    "H-ipv6-without-brackets": Case(
        ("-H", "::1:4"), "-H entry '::1:4': an IPv6 address must be written in brackets"
    ),
    "H-bad-ipv6": Case(("-H", "[fe80::zz]:2"), "'fe80::zz' is not an IPv6 address"),
    "H-empty": Case(("-H", ""), "-H is empty"),
    "H-stray-comma": Case(("-H", "a,,b"), "has an empty entry"),
    "H-duplicate": Case(("-H", "a:2,b,a:4"), "-H names the same host twice: 'a:2' and 'a:4'"),
    "H-looks-like-ssh-option": Case(("-H", "-oProxyCommand=x"), "bad host name '-oProxyCommand=x'"),
    "hostfile-zero-slots": Case(
        HOSTFILE,
        "{tmp}/hosts:3: slots must be a positive integer, got '0' in 'b slots=0'",
        files={"hosts": "# cluster\na slots=2\nb slots=0\n"},
    ),
    "hostfile-unknown-key": Case(
        HOSTFILE, "{tmp}/hosts:1: unknown key 'gpus'", files={"hosts": "a slots=2 gpus=8 # nodes\n"}
    ),
    "hostfile-max-below-slots": Case(
        HOSTFILE,
        "{tmp}/hosts:1: max_slots=2 is less than slots=4",
        files={"hosts": "a slots=4 max_slots=2\n"},
    ),
    "hostfile-not-key-value": Case(
        HOSTFILE, "{tmp}/hosts:2: expected KEY=VALUE", files={"hosts": "a\nb 4\n"}
    ),
    "hostfile-duplicate": Case(
        HOSTFILE,
        "{tmp}/hosts:4: host 'a' is already listed at {tmp}/hosts:1",
        files={"hosts": "a slots=2\nb\n\na:2\n"},
    ),
    "hostfile-empty": Case(
        HOSTFILE, "hostfile {tmp}/hosts lists no hosts", files={"hosts": "# none yet\n\n"}
    ),
    "hostfile-missing": Case(
        ("--hostfile", "{tmp}/nope.txt"), "cannot read hostfile {tmp}/nope.txt: No such file or directory"
    ),
    "hostfile-is-directory": Case(("--hostfile", "{tmp}"), "cannot read hostfile {tmp}:"),
    "too-many-processes": Case(
        ("-np", "16", "-H", "a:4,b:8"), "requested 16 processes but the hosts provide 12 slots"
    ),
    "too-many-even-with-max-slots": Case(
        ("-np", "16", *HOSTFILE),
        "requested 16 processes but the hosts provide 12 slots (14 with max_slots)",
        files={"hosts": "a slots=4 max_slots=6\nb slots=8\n"},
    ),
    "np-zero": Case(("-np", "0"), "0 is not in the range x>=1"),
    "np-negative": Case(("-np", "-3"), "-3 is not in the range x>=1"),
    "np-not-a-number": Case(("-np", "two"), "'two' is not a valid integer"),
    "np-zero-from-env": Case((), "0 is not in the range x>=1", env={"DISTRUN_NUM_PROC": "0"}),
    "H-and-hostfile": Case(
        ("-H", "a", *HOSTFILE), "use either -H/--hosts or --hostfile, not both", files={"hosts": "a\n"}
    ),
    "missing-command": Case(("-np", "2"), "missing command", command=False),
    "x-bad-name": Case(("-x", "1A=2"), "-x: '1A' is not a valid environment variable name"),
    "x-rank": Case(("-x", "RANK=1"), "-x RANK: distrun sets RANK for every rank"),
    # The value may be a secret: messages never repeat it.
    "x-bad-name-hides-value": Case(("-x", "HF-TOKEN=hf_secret123"), "-x: 'HF-TOKEN' is not a valid"),
    "x-master-addr": Case(
        ("-x", "MASTER_ADDR=h"), "distrun sets MASTER_ADDR for every rank; use --master-addr"
    ),
    "x-torchelastic": Case(("-x", "TORCHELASTIC_RUN_ID=r"), "distrun sets TORCHELASTIC_RUN_ID"),
    "x-distrun-variable": Case(("-x", "DISTRUN_RUN_ID=r"), "distrun sets DISTRUN_RUN_ID"),
    "x-missing-from-environment": Case(
        ("-x", "SURELY_NOT_SET_42"), "-x SURELY_NOT_SET_42: SURELY_NOT_SET_42 is not set here"
    ),
    "ranks-backwards": Case(("-np", "4", "--ranks", "3-1"), "--ranks '3-1': the range '3-1' runs backwards"),
    "ranks-beyond-world": Case(("-np", "2", "--ranks", "0,9"), "rank 9 does not exist (ranks are 0..1)"),
    "ranks-garbage": Case(("--ranks", "0,x"), "'x' is not a rank or a range like 2-5"),
    "timeout-zero": Case(("--timeout", "0"), "--timeout must be a positive number of seconds, got 0"),
    "timeout-negative": Case(("--timeout", "-5"), "--timeout must be a positive number of seconds, got -5"),
    "timeout-not-a-number": Case(("--timeout", "soon"), "'soon' is not a valid float"),
    "grace-zero": Case(("--grace-period", "0"), "--grace-period must be a positive number of seconds"),
    "prefix-unknown": Case(("--prefix", "pid"), "'pid' is not one of 'rank', 'host', 'none'"),
    "master-port-zero": Case(("--master-port", "0"), "0 is not in the range 1<=x<=65535"),
    "master-port-too-big": Case(("--master-port", "65536"), "65536 is not in the range 1<=x<=65535"),
    "config-bad-yaml": Case(
        ("--config", "{tmp}/c.yaml"), "{tmp}/c.yaml:2: not valid YAML", files={"c.yaml": "hosts: [a,\n"}
    ),
    "config-unknown-key": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml:1: unknown option 'workers'",
        files={"c.yaml": "workers: 4\n"},
    ),
    "config-not-a-mapping": Case(
        ("--config", "{tmp}/c.yaml"), "expected a mapping of option names", files={"c.yaml": "- -np\n- 4\n"}
    ),
    "config-bad-value": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml:1: timeout: 'never' is not a valid float",
        files={"c.yaml": "timeout: never\n"},
    ),
    "config-missing": Case(
        ("--config", "{tmp}/none.yaml"), "cannot read config file {tmp}/none.yaml: No such file or directory"
    ),
    # Even root cannot make directories in /proc: found only when distrun creates it, still before any start.
    "output-dir-cannot-be-made": Case(
        ("--output-dir", "/proc/distrun-test/logs"), "--output-dir /proc/distrun-test/logs: No such file"
    ),
    "output-dir-is-a-file": Case(
        ("--output-dir", "{tmp}/log.txt"),
        "--output-dir {tmp}/log.txt: {tmp}/log.txt is a file",
        files={"log.txt": ""},
    ),
    "unknown-option": Case(("--num-procs", "2"), "No such option '--num-procs'"),
    "host-key-policy-unknown": Case(("--host-key-policy", "trust-all"), "'trust-all' is not one of"),
    "identity-file-missing": Case(("-i", "{tmp}/id_none"), "'{tmp}/id_none' does not exist"),
    # Issue 10's hardening: each of these used to start something, hang or pick the wrong meaning.
    "np-far-beyond-this-machine": Case(
        ("-np", "99999999999", "--dry-run"), "-np 99999999999: this machine has", command=True
    ),
    "np-far-beyond-even-oversubscribed": Case(
        ("-np", "99999999999", "--oversubscribe", "--dry-run"), "distrun starts at most 1024 per host"
    ),
    "hosts-slots-absurd": Case(("-H", "a:99999999999"), "requested 99999999999 processes on 1 host"),
    "same-machine-two-names": Case(
        ("-H", "localhost:2,127.0.0.1:2"), "-H 'localhost:2' and -H '127.0.0.1:2' are both this machine"
    ),
    "config-float-for-integer": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml:1: num-proc: expected a whole number, got 2.7",
        files={"c.yaml": "num-proc: 2.7\n"},
    ),
    "config-duplicate-key": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml:3: 'timeout' is already set at line 1",
        files={"c.yaml": "timeout: 5\nnum-proc: 1\ntimeout: 6\n"},
    ),
    "config-value-names-file-and-key": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml:1: timeout must be a positive number of seconds",
        files={"c.yaml": "timeout: -1\n"},
    ),
    "config-relative-hostfile": Case(
        ("--config", "{tmp}/c.yaml"),
        "{tmp}/h.txt:1: slots must be a positive integer",
        files={"c.yaml": "hostfile: h.txt\n", "h.txt": "a slots=x\n"},
    ),
    "env-file-bad-line": Case(
        ("--env-file", "{tmp}/job.env"),
        "{tmp}/job.env:2: 'HF-TOKEN' is not a valid",
        files={"job.env": "A=1\nHF-TOKEN=hf_secret123\n"},
    ),
    "env-file-rank": Case(
        ("--env-file", "{tmp}/job.env"),
        "{tmp}/job.env:1 RANK: distrun sets RANK",
        files={"job.env": "RANK=1\n"},
    ),
    "env-file-missing": Case(("--env-file", "{tmp}/none.env"), "cannot read env file {tmp}/none.env"),
    "report-in-missing-directory": Case(
        ("--report", "{tmp}/no/such/dir/r.json"),
        "--report {tmp}/no/such/dir/r.json: directory {tmp}/no/such/dir",
    ),
    "report-is-directory": Case(("--report", "{tmp}"), "--report {tmp}: is a directory"),
    "redact-empty": Case(("--redact", " "), "--redact: expected a variable name or glob"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input(case: Case, tmp_path: Path) -> None:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path))

    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    marker = tmp_path / "worker-ran"
    command = (*WORKER, str(marker)) if case.command else ()
    env = clean_env(**{name: fill(value) for name, value in case.env.items()})

    result = run_distrun(*map(fill, case.args), *command, env=env, timeout=60)

    stdout, stderr = result.stdout.decode(), result.stderr.decode()
    assert "Traceback" not in stdout + stderr
    assert result.returncode == 2, stderr
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    assert stderr.startswith("distrun: error: "), stderr
    assert fill(case.expected) in stderr
    assert "hf_secret123" not in stderr, "a value given with -x must never be echoed"
    assert stdout == ""
    assert not marker.exists()


def test_an_unknown_distrun_variable_is_one_warning_line() -> None:
    result = run_distrun("--dry-run", "true", env=clean_env(DISTRUN_TIMEOUTS="5"))
    assert result.returncode == 0
    assert result.stderr.decode() == (
        "distrun: DISTRUN_TIMEOUTS names no option of distrun and is ignored "
        "(did you mean DISTRUN_TIMEOUT?)\n"
    )
