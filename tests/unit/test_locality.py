"""One machine under two names is refused by what its agents report (issue 19, defect 11)."""

from __future__ import annotations

import pytest

from launcher.agent.facts import machine_identity
from launcher.backends.locality import refuse_one_machine_twice
from launcher.core.hosts import Host
from launcher.errors import HostSpecError


def test_distinct_machines_and_unknown_identities_pass() -> None:
    hosts = [Host("a", 2), Host("b", 2), Host("c", 1), Host("d", 1)]
    refuse_one_machine_twice(hosts, ["m1/boot/1/a", "m2/boot/1/b", "", ""])


@pytest.mark.parametrize(
    ("names", "identities", "message"),
    [
        (("dr-h1", "198.19.250.11"), ("m/b/n/dr-h1", "m/b/n/dr-h1"), "dr-h1 and 198.19.250.11 are the same"),
        (("a", "b", "a-alias"), ("x", "y", "x"), "a and a-alias are the same machine"),
    ],
)
def test_one_machine_twice_is_refused_naming_both(
    names: tuple[str, ...], identities: tuple[str, ...], message: str
) -> None:
    with pytest.raises(HostSpecError, match=message) as caught:
        refuse_one_machine_twice([Host(n, 1) for n in names], identities)
    assert "list it once with all its slots" in str(caught.value)
    assert caught.value.exit_code == 2


def test_this_machine_has_an_identity() -> None:
    identity = machine_identity()
    assert identity.count("/") == 3 and identity == machine_identity()
