"""distrun: start a distributed training job on every host with one command."""

from __future__ import annotations

__version__ = "0.1.0"
