from __future__ import annotations

from pathlib import Path

import pytest

from launcher.core.hosts import Host, parse_host_list, parse_hostfile
from launcher.errors import HostfileError, HostSpecError
from tests.support import REPO


def write(tmp_path: Path, text: str, name: str = "hosts.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("a", [Host("a", 1, origin="-H 'a'")]),
        ("a:4", [Host("a", 4, origin="-H 'a:4'")]),
        ("alice@a:2", [Host("a", 2, user="alice", origin="-H 'alice@a:2'")]),
        ("[::1]:3", [Host("::1", 3, origin="-H '[::1]:3'")]),
        ("[fe80::1%eth0]", [Host("fe80::1%eth0", 1, origin="-H '[fe80::1%eth0]'")]),
        ("bob@[fd00::2]:2", [Host("fd00::2", 2, user="bob", origin="-H 'bob@[fd00::2]:2'")]),
        ("10.0.0.1:2", [Host("10.0.0.1", 2, origin="-H '10.0.0.1:2'")]),
    ],
    ids=["bare", "slots", "user", "ipv6-slots", "ipv6-zone", "user-ipv6", "ipv4"],
)
def test_host_list_entry(spec: str, expected: list[Host]) -> None:
    assert list(parse_host_list(spec)) == expected


def test_host_list_keeps_order_and_trims_blanks() -> None:
    hosts = parse_host_list(" b:2 , a:4,c ")
    assert [(h.name, h.slots) for h in hosts] == [("b", 2), ("a", 4), ("c", 1)]


def test_same_name_with_different_users_is_one_host_listed_twice() -> None:
    with pytest.raises(HostSpecError, match="names the same host twice: 'alice@a' and 'bob@a'"):
        parse_host_list("alice@a,bob@a")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "-H is empty"),
        ("  ", "-H is empty"),
        ("a,,b", "empty entry"),
        ("a,", "empty entry"),
        ("a:0", "-H entry 'a:0': slots must be a positive integer, got '0'"),
        ("a:-2", "got '-2'"),
        ("a:x", "got 'x'"),
        ("a:", "got ''"),
        ("a:1.5", "got '1.5'"),
        (":4", "missing host name"),
        ("::1:4", "must be written in brackets"),
        ("fe80::1", "must be written in brackets"),
        ("[::1", "missing ']'"),
        ("[nothost]:2", "is not an IPv6 address"),
        ("[::1]4", "unexpected '4' after ']'"),
        ("-oProxyCommand=x", "bad host name"),
        ("a b", "bad host name"),
        ("@a", "bad user name"),
        ("a:2,b,A:3", "same host twice: 'a:2' and 'A:3'"),
        ("[::1],[0::1]:2", "same host twice"),
    ],
)
def test_host_list_error(spec: str, message: str) -> None:
    with pytest.raises(HostSpecError) as info:
        parse_host_list(spec)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_hostfile_forms(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# a comment\n"
        "\n"
        "a slots=4 max_slots=6   # trailing comment\n"
        "b:2\n"
        "c\n"
        "alice@d slots = 3 max-slots=3\n"
        "[fd00::1] SLOTS=2\n",
    )
    hosts = parse_hostfile(path)
    assert [(h.user, h.name, h.slots, h.max_slots) for h in hosts] == [
        (None, "a", 4, 6),
        (None, "b", 2, None),
        (None, "c", 1, None),
        ("alice", "d", 3, 3),
        (None, "fd00::1", 2, None),
    ]
    assert hosts[0].origin == f"{path}:3"
    assert hosts[0].capacity == 6
    assert hosts[1].capacity == 2


def test_hostfile_max_slots_alone_keeps_one_slot(tmp_path: Path) -> None:
    (host,) = parse_hostfile(write(tmp_path, "a max_slots=3\n"))
    assert (host.slots, host.max_slots) == (1, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a slots=0\n", ":1: slots must be a positive integer, got '0' in 'a slots=0'"),
        ("a\nb slots=-1\n", ":2: slots must be a positive integer, got '-1'"),
        ("a max_slots=2 slots=4\n", ":1: max_slots=2 is less than slots=4"),
        ("a cpus=4\n", ":1: unknown key 'cpus'"),
        ("a 4\n", ":1: expected KEY=VALUE, got '4'"),
        ("a:2 slots=4\n", ":1: slots is given twice"),
        ("a max_slots=4 max-slots=4\n", ":1: max_slots is given twice"),
        ("a slots=x  # why\n", ":1: slots must be a positive integer, got 'x' in 'a slots=x  # why'"),
        # More digits than int() takes (4,300): the same line, not int()'s own words.
        ("a slots=" + "1" * 5000 + "\n", ":1: slots must be a positive integer, got '111"),
        ("::1 slots=2\n", ":1: an IPv6 address must be written in brackets"),
    ],
)
def test_hostfile_error_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(HostfileError) as info:
        parse_hostfile(path)
    assert str(info.value).startswith(str(path) + ":")
    assert message in str(info.value)


def test_hostfile_duplicate_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "a slots=2\n# spacer\nb\nA:4\n")
    with pytest.raises(HostfileError) as info:
        parse_hostfile(path)
    assert str(info.value) == f"{path}:4: host 'A' is already listed at {path}:1"


@pytest.mark.parametrize("text", ["", "\n\n", "# only\n   # comments\n"], ids=["empty", "blank", "comments"])
def test_empty_hostfile(tmp_path: Path, text: str) -> None:
    with pytest.raises(HostfileError, match="lists no hosts"):
        parse_hostfile(write(tmp_path, text))


def test_missing_hostfile(tmp_path: Path) -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(tmp_path / "nope.txt")
    assert str(info.value) == f"cannot read hostfile {tmp_path / 'nope.txt'}: No such file or directory"


def test_hostfile_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="cannot read hostfile"):
        parse_hostfile(tmp_path)


def test_binary_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe\x00a")
    with pytest.raises(HostfileError, match="not UTF-8"):
        parse_hostfile(path)


@pytest.mark.parametrize("path", sorted((REPO / "hostfiles").iterdir()), ids=lambda p: p.name)
def test_every_example_hostfile_parses(path: Path) -> None:
    hosts = parse_hostfile(path)
    assert hosts
    assert all(h.slots >= 1 for h in hosts)


def test_a_hostfile_that_starts_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Editors on Windows save UTF-8 with a BOM; it is not part of the first host's name (issue 31)."""
    path = tmp_path / "hosts"
    path.write_bytes("\ufeffh1 slots=2\nh2:1\n".encode())
    assert [(h.name, h.slots) for h in parse_hostfile(path)] == [("h1", 2), ("h2", 1)]
