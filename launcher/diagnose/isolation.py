"""A diagnosis tool's failure never ends the job (issue 38).

Stack capture and parsing, grouping and the verdict, `distrun top`'s samples, the stall and straggler
watches, the report's samples: each runs inside the job's loop, so an error of theirs would otherwise end the
launcher and every rank with it. `Isolation.guard` is the boundary, one per tool where the job's loop calls
it: the error becomes one line naming the tool and the error (once per distinct error, however often the
tool is called) and the job runs on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)


def describe(err: BaseException) -> str:
    """`TypeError: '<' not supported ...`, on one line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class Isolation:
    """Where the diagnosis tools' errors stop; what they said is kept in `said`, in order."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def failed(self, tool: str, err: BaseException) -> str:
        """Say (once) that `tool` failed with `err`; returns the words without "the job runs on"."""
        return self.say(f"{tool} failed: {describe(err)}")

    def say(self, text: str) -> str:
        """One line of a tool's failure (an agent's, as it sent it), once however often it comes."""
        if text not in self.said:
            self.said.append(text)
            log.warning("%s; the job runs on", text)
        return text

    @contextlib.contextmanager
    def guard(self, tool: str) -> Iterator[None]:
        """Run the block as `tool`: any error of it is said and ends there."""
        try:
            yield
        except Exception as err:  # the boundary: whatever the tool did wrong, the job must not end
            self.failed(tool, err)
