"""Same code, same software: what every host will run with (workdir copy, Python, torch, CUDA, NCCL),
compared.

Pure: the probe and the sync gather each host's values; this module names the hosts that differ from the
rest, one line each ("h3: torch 2.12.0, others 2.13.0").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from launcher.errors import HostError

# What is compared, in the order lines name it, with the label a value gets.
FIELDS = (
    ("workdir", "workdir"),
    ("python", "Python"),
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("nccl", "NCCL"),
)


class MismatchError(HostError):
    """Hosts would run different code or different software (exit 3; --allow-mismatch runs anyway)."""


def _shown(label: str, value: str) -> str:
    return f"{label} {value or 'none'}"


def differences(hosts: Sequence[tuple[str, Mapping[str, str]]]) -> list[str]:
    """One line per host whose values differ from the most common ones (ties: the first host's)."""
    lines = []
    usual: dict[str, str] = {}
    for key, _ in FIELDS:
        seen = [values.get(key, "") for _, values in hosts]
        counts = Counter(seen)
        top = max(counts.values(), default=0)
        usual[key] = next((v for v in seen if counts[v] == top), "")
    for name, values in hosts:
        odd = [
            f"{_shown(label, values.get(key, ''))}, others {usual[key] or 'none'}"
            for key, label in FIELDS
            if values.get(key, "") != usual[key]
        ]
        if odd:
            lines.append(f"{name}: {'; '.join(odd)}")
    return lines


def refuse(lines: Sequence[str]) -> MismatchError:
    count = len(lines)
    return MismatchError(
        f"{count} host{'s' if count > 1 else ''} would run different code or a different stack than the "
        "others (listed above); make them match, or give --allow-mismatch"
    )
