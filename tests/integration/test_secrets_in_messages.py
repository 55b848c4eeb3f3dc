"""No message of distrun, error or not, prints a value the redaction rule covers (issue 19, defect 8).

Each case puts a secret where a user plausibly mistypes it (a `:` or a blank for `=`, a value with a blank
in DISTRUN_EXPORT, a secret where a host or an option belongs) and runs the real distrun: whatever it says, on
stdout or stderr, the secret, and any word of it, is not there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher.core.scrub import Scrubber
from tests.support import clean_env, run_distrun

SECRET = "sk-live-123456"


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    code: int = 2


CASES = {
    "env-file-colon": Case(("--env-file", "{tmp}/e.env"), files={"e.env": f"API_TOKEN: {SECRET}\n"}),
    "env-file-blank": Case(("--env-file", "{tmp}/e.env"), files={"e.env": f"A=1\nAPI_TOKEN {SECRET}\n"}),
    "env-file-dash-name": Case(("--env-file", "{tmp}/e.env"), files={"e.env": f"API-TOKEN={SECRET}\n"}),
    "config-export-blank": Case(
        ("--config", "{tmp}/c.yaml"), files={"c.yaml": f'export: ["API_TOKEN {SECRET}"]\n'}
    ),
    "x-blank": Case(("-x", f"API_TOKEN {SECRET}")),
    "x-colon": Case(("-x", f"API_TOKEN:{SECRET}")),
    "distrun-export-value-with-blank": Case(
        (), env={"DISTRUN_EXPORT": f"OPENAI_API_KEY=sk-abc {SECRET.replace('-', '')}"}
    ),
    # The secret is known (this shell's API_KEY) and lands where a host name belongs.
    "secret-as-host": Case(("-H", f"{SECRET}:x"), env={"API_KEY": SECRET}),
    "secret-as-master-addr": Case(("--master-addr", f"{SECRET} x"), env={"DB_PASSWORD": SECRET}),
    "url-password-as-python": Case(
        ("--python", f"https://u:{SECRET}@h x"), env={"HTTPS_PROXY": f"https://u:{SECRET}@proxy"}
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_no_message_shows_a_secret(case: Case, tmp_path: Path) -> None:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path))

    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    env = clean_env(**{k: fill(v) for k, v in case.env.items()})
    result = run_distrun(*map(fill, case.args), "-v", sys.executable, "-c", "pass", env=env, timeout=60)
    said = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == case.code, said
    assert said.startswith("distrun: error: ") and said.count("\n") == 1, said
    for word in (SECRET, SECRET.replace("-", ""), "live", "123456"):
        assert word not in said, f"{word!r} shown: {said}"


def test_scrubber_replaces_every_known_secret_and_nothing_else() -> None:
    scrub = Scrubber()
    scrub.learn({"HF_TOKEN": "hf_abcdef", "PATH": "/usr/bin", "A": "postgres://me:pw12345@db/x", "PW": "1"})
    scrub.learn([("MYCO_THING", "topsecret")], patterns=["MYCO_*"])
    text = "token hf_abcdef, url pw12345, glob topsecret, path /usr/bin, short 1"
    assert scrub(text) == "token <redacted>, url <redacted>, glob <redacted>, path /usr/bin, short 1"
