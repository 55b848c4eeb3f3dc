"""Parse `-H` strings and hostfiles into `Host` records (pure: no name resolution; only reads the file)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import HostfileError, HostSpecError


@dataclass(frozen=True)
class Host:
    """One host as the user named it.

    `name` is the host name or address without user or brackets (`::1`, not `[::1]`);
    `origin` says where it came from, for messages: `-H 'a:4'` or `hostfiles/x.txt:3`.
    """

    name: str
    slots: int = 1
    max_slots: int | None = None
    user: str | None = None
    origin: str = ""

    @property
    def capacity(self) -> int:
        """How many ranks the host may take when oversubscription up to max_slots is needed."""
        return self.max_slots if self.max_slots is not None else self.slots


# A leading '-' is refused because ssh would read such a name as an option.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
# 18 digits at most: int() refuses a number of over 4,300 digits (an absurd count of fewer is refused later,
# naming the processes it asks for).
_COUNT_RE = re.compile(r"[0-9]{1,18}\Z")
# OpenMPI accepts both spellings of max_slots; both mean the same field here.
_HOSTFILE_KEYS = {"slots": "slots", "max_slots": "max_slots", "max-slots": "max_slots"}
# OpenMPI also accepts `slots = 4`; squeezing the blanks keeps one field per key.
_EQUALS_RE = re.compile(r"\s*=\s*")


def is_host_name(text: str) -> bool:
    """A plain host name (or IPv4 address) as `-H` and hostfiles accept it."""
    return bool(_NAME_RE.match(text))


@dataclass(frozen=True)
class _Token:
    """One host of a -H list or a hostfile line, as written."""

    user: str | None
    name: str
    slots: int | None


def _positive(text: str, what: str) -> int:
    if not _COUNT_RE.match(text) or int(text) == 0:
        raise ValueError(f"{what} must be a positive integer, got {text!r}")
    return int(text)


def _could_be_ipv6(text: str) -> bool:
    """Whether `text`, or `text` less a `:SLOTS` at its end, is an IPv6 address (the hint about brackets
    helps only then; `localhost:2:3` is no address)."""
    for candidate in (text, text.rpartition(":")[0]):
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        return True
    return False


def _parse_token(token: str) -> _Token:
    """Parse `[user@]host[:slots]` or `[user@][ipv6][:slots]`; ValueError says what is wrong."""
    user_text, at, rest = token.rpartition("@")
    user = None
    if at:
        if not _NAME_RE.match(user_text):
            raise ValueError(f"bad user name {user_text!r}")
        user = user_text
    slots = None
    if rest.startswith("["):
        name, bracket, tail = rest[1:].partition("]")
        if not bracket:
            raise ValueError("missing ']' after the IPv6 address")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            raise ValueError(f"{name!r} is not an IPv6 address") from None
        if tail:
            if not tail.startswith(":"):
                raise ValueError(f"unexpected {tail!r} after ']' (expected ':SLOTS')")
            slots = _positive(tail[1:], "slots")
        return _Token(user, name, slots)
    if rest.count(":") > 1:
        if _could_be_ipv6(rest):
            # `fe80::1:4` could be the address fe80::1:4 or fe80::1 with 4 slots; brackets settle it.
            raise ValueError("an IPv6 address must be written in brackets, as in [fe80::1] or [fe80::1]:4")
        raise ValueError("more than one ':' (expected HOST or HOST:SLOTS)")
    name, colon, slots_text = rest.partition(":")
    if colon:
        slots = _positive(slots_text, "slots")
    if not name:
        raise ValueError("missing host name")
    if not _NAME_RE.match(name):
        raise ValueError(f"bad host name {name!r}")
    return _Token(user, name, slots)


def parse_host_entry(token: str, origin: str) -> Host:
    """One `[user@]host[:slots]` entry; ValueError says what is wrong with it."""
    parsed = _parse_token(token.strip())
    return Host(name=parsed.name, slots=parsed.slots or 1, user=parsed.user, origin=origin)


def _host_key(host: Host) -> str:
    """Two entries naming the same host (DNS names are case-insensitive), whatever the user.

    One host is one node: one agent, one connection, one set of local ranks. The same host under two
    users would be two nodes fighting over the same GPUs and ports.
    """
    try:
        return ipaddress.ip_address(host.name).compressed
    except ValueError:
        return host.name.lower()


def parse_host_list(spec: str, source: str = "-H") -> tuple[Host, ...]:
    """Parse a `-H` value: comma-separated `host`, `host:slots`, `user@host:slots`, `[ipv6]:slots`.

    `source` names where the value came from in messages: `-H`, or `FILE:LINE: hosts` for a config file.
    """
    if not spec.strip():
        raise HostSpecError(f"{source} is empty: expected hosts such as host1:4,host2:4")
    hosts: list[Host] = []
    seen: dict[str, str] = {}
    for raw in spec.split(","):
        token = raw.strip()
        if not token:
            raise HostSpecError(f"{source} {spec!r} has an empty entry (a stray comma?)")
        try:
            parsed = _parse_token(token)
        except ValueError as err:
            raise HostSpecError(f"{source} entry {token!r}: {err}") from None
        host = Host(name=parsed.name, slots=parsed.slots or 1, user=parsed.user, origin=f"{source} {token!r}")
        key = _host_key(host)
        if key in seen:
            raise HostSpecError(f"{source} names the same host twice: {seen[key]!r} and {token!r}")
        seen[key] = token
        hosts.append(host)
    return tuple(hosts)


def _parse_hostfile_line(line: str, origin: str) -> Host:
    fields = _EQUALS_RE.sub("=", line).split()
    token = _parse_token(fields[0])
    values: dict[str, int] = {}
    if token.slots is not None:
        values["slots"] = token.slots
    for field in fields[1:]:
        key, equals, value = field.partition("=")
        canonical = _HOSTFILE_KEYS.get(key.lower())
        if not equals:
            raise ValueError(f"expected KEY=VALUE, got {field!r}")
        if canonical is None:
            raise ValueError(f"unknown key {key!r} (known: slots, max_slots, max-slots)")
        if canonical in values:
            raise ValueError(f"{canonical} is given twice")
        values[canonical] = _positive(value, key)
    slots = values.get("slots", 1)
    max_slots = values.get("max_slots")
    if max_slots is not None and max_slots < slots:
        raise ValueError(f"max_slots={max_slots} is less than slots={slots}")
    return Host(name=token.name, slots=slots, max_slots=max_slots, user=token.user, origin=origin)


def parse_hostfile(path: Path) -> tuple[Host, ...]:
    """Parse an OpenMPI-style hostfile: `host slots=N [max_slots=M]`, `host:N`, `host`, `# comments`."""
    try:
        # utf-8-sig: an editor's byte-order mark is not part of the first host's name.
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise HostfileError(f"cannot read hostfile {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise HostfileError(f"cannot read hostfile {path}: it is not UTF-8 text") from None
    hosts: list[Host] = []
    seen: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        origin = f"{path}:{number}"
        try:
            host = _parse_hostfile_line(line, origin)
        except ValueError as err:
            raise HostfileError(f"{origin}: {err} in {raw.strip()!r}") from None
        key = _host_key(host)
        if key in seen:
            raise HostfileError(f"{origin}: host {host.name!r} is already listed at {seen[key]}")
        seen[key] = origin
        hosts.append(host)
    if not hosts:
        raise HostfileError(f"hostfile {path} lists no hosts (it is empty or all comments)")
    return tuple(hosts)
