"""Shared by the tests of the supervisor with a JobWatch driven in-process with fake links (tests/unit)."""

from __future__ import annotations

from launcher.agent.protocol import (
    STACK_DUMP,
    STACKS,
    Frame,
    FrameReader,
    StackReply,
    StacksRequest,
    decode_message,
    encode_message,
)
from launcher.diagnose.watch import JobWatch, WatchOptions
from launcher.job.supervise import Supervisor
from launcher.runtime.loop import Deadline
from launcher.runtime.node import HostAttempt
from tests.fakes import FakeLink, fake_hosts, memory_relay

WAIT = 10.0
FRAMES = [["<module>", "/job/train.py", 3], ["stuck_in_loader", "/job/train.py", 41]]


def watched(timeout: float) -> tuple[list[HostAttempt], Supervisor, JobWatch]:
    hosts = fake_hosts({"h1": 2, "h2": 1})
    relay, _, _ = memory_relay({s.rank: h.name for h in hosts for s in h.slots})
    watch = JobWatch(relay, WatchOptions(wait=WAIT))
    sup = Supervisor(hosts, relay, deadline=Deadline(timeout, 0.0), grace=1.0, dead_after=100.0, watch=watch)
    watch.attempt_started(hosts, 0.0)
    return hosts, sup, watch


def sent(host: HostAttempt) -> list[Frame]:
    assert isinstance(host.link, FakeLink)
    return host.link.sent


def reply(sup: Supervisor, host: HostAttempt, ranks: list[dict[str, object]], now: float) -> None:
    """The host's agent answers the STACKS request it was sent."""
    request = decode_message(StacksRequest, next(f for f in sent(host) if f.kind == STACKS).payload)
    for frame in FrameReader().feed(encode_message(STACK_DUMP, StackReply(request.request_id, ranks))):
        sup.on_frame(host, frame, now)
