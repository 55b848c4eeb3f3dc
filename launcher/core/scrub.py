"""The last guard on distrun's own words: no message, error or log line, shows a secret value it knows.

Values come from the variables the redaction rule covers (`launcher.core.env.is_secret`, `--redact` globs):
this
shell's, `--env-file`'s and `-x`'s, and passwords inside URLs in any of their values. Parsers already avoid
quoting what may be a value; this catches what reaches a message another way (a host name, an option's value,
a remote error that echoes what it was given, a rank's stderr quoted in the summary).

Every sink of distrun's own text passes through SCRUBBER: the console's notes and blocks
(launcher.console.relay), log records (a filter on every handler), errors, the `--report` document
(`Scrubber.json`: every string in it) and the stacks files and answers (launcher.diagnose.watch). A rank's
own output is relayed as it is written.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from launcher.core.env import REDACTED, is_secret, url_passwords

# Shorter values would blank out ordinary words and digits in every message; secrets are longer.
MIN_SECRET_LEN = 5


class Scrubber(logging.Filter):
    """Replaces every known secret value in a text with <redacted>; also a filter for log records."""

    def __init__(self) -> None:
        super().__init__()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def learn(self, env: Mapping[str, str] | Iterable[tuple[str, str]], patterns: Sequence[str] = ()) -> None:
        pairs = env.items() if isinstance(env, Mapping) else env
        found = set()
        for name, value in pairs:
            if is_secret(name, patterns):
                found.add(value)
            found.update(url_passwords(value))
        found = {v for v in found if len(v) >= MIN_SECRET_LEN} - self._values
        if found:
            self._values |= found
            # Longest first, so that a secret containing another is replaced whole.
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))

    def __call__(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is not None:
            record.msg, record.args = self(record.getMessage()), None
            if record.exc_info and not record.exc_text:  # a traceback quotes values too
                record.exc_text = self(logging.Formatter().formatException(record.exc_info))
            if record.stack_info:
                record.stack_info = self(record.stack_info)
        return True

    def json(self, value: Any) -> Any:
        """`value` (JSON-like: dicts, lists, strings, numbers) with every string in it scrubbed, keys too."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self.json(k): self.json(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(v) for v in value]
        return value


SCRUBBER = Scrubber()
