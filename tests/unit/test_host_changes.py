"""launcher.core.host_changes: what a change of the discovery script's hosts does to the running world."""

from __future__ import annotations

from launcher.core.host_changes import ADDED, REMOVED, hosts_update, regroup
from launcher.core.hosts import Host


def test_the_same_hosts_in_another_order_are_no_update() -> None:
    assert hosts_update([Host("a", 2), Host("b", 1)], [Host("b", 1), Host("a", 2)]) is None


def test_a_new_host_or_more_slots_is_added_a_gone_host_or_fewer_slots_removed() -> None:
    update = hosts_update([Host("a", 2), Host("b", 2)], [Host("a", 3), Host("c", 1), Host("b", 1)])
    assert update is not None
    assert (update.added, update.removed, update.kind) == (("a", "c"), ("b",), ADDED | REMOVED)
    assert update.cause == "hosts added: a, c; removed: b (--host-discovery-script)"
    removed = hosts_update([Host("a", 1), Host("b", 1)], [Host("b", 1)])
    assert removed is not None and removed.kind == REMOVED


def test_a_removed_hosts_ranks_leave_and_the_others_keep_their_order() -> None:
    members = [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    regrouped = regroup(members, [Host("b", 2)], max_np=4)
    assert (regrouped.staying, regrouped.leaving, regrouped.newcomers) == ((2, 3), (0, 1), ())


def test_a_host_with_fewer_slots_keeps_its_lowest_ranks() -> None:
    regrouped = regroup([(0, "a"), (4, "b"), (1, "a"), (2, "a")], [Host("a", 2), Host("b", 1)], max_np=8)
    assert (regrouped.staying, regrouped.leaving) == ((0, 4, 1), (2,))


def test_newcomers_fill_new_slots_in_the_scripts_order_up_to_max_np() -> None:
    hosts = [Host("a", 2), Host("c", 2), Host("b", 2)]
    regrouped = regroup([(0, "a"), (1, "a")], hosts, max_np=5)
    assert [host.name for host in regrouped.newcomers] == ["c", "c", "b"]
    assert regroup([(0, "a"), (1, "a")], hosts, max_np=2).newcomers == ()


def test_a_failed_ranks_slot_is_not_refilled_a_new_hosts_slot_is() -> None:
    hosts = [Host("a", 2), Host("b", 2), Host("c", 2)]
    regrouped = regroup([(1, "a"), (2, "b"), (3, "b")], hosts, max_np=4, failed={"a": 1})
    assert [host.name for host in regrouped.newcomers] == ["c"]
