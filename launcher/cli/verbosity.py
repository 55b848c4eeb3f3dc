"""-v's levels: what distrun logs on stderr (warnings; -v what it does; -vv SSH details too), each line
scrubbed of the secrets it knows (launcher/core/scrub.py)."""

from __future__ import annotations

import logging
import sys

from launcher.core.scrub import SCRUBBER


def configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(format="distrun: %(message)s", level=level, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        if SCRUBBER not in handler.filters:
            handler.addFilter(SCRUBBER)
