"""The background engine of a process set (Horovod's background thread): operations are submitted, agreed by
name across the ranks in whatever order each rank submits them, and issued on the data group by the engine
alone, small allreduces fused into one collective.

A rank's collective calls enqueue an entry and return at once; the set's engine thread
(``collectives-engine-<set id>``) runs agreement rounds (``collectives.engine_rounds``) on its own gloo group,
every ``HOROVOD_CYCLE_TIME`` ms while there is work, and issues each operation that every rank has submitted,
in the order all ranks derive from the same round. A small CPU allreduce may instead ride in the round
itself (see ``collectives.engine_rounds``): every rank reduces the same bytes, and no collective is issued.
A named ``_async`` operation is keyed by its name; blocking and unnamed operations by their place in the
set's ordered sequence, so they keep the in-order contract (and a name mismatch between blocking calls is a
:class:`MismatchError`). Rows that disagree raise
:class:`MismatchError` from the operation's handle on every rank. Ready allreduces of the same dtype, device,
op and scaling are fused up to ``HOROVOD_FUSION_THRESHOLD`` bytes. An operation that some ranks submitted and
others did not for ``HOROVOD_STALL_CHECK_TIME_SECONDS`` is logged (which ranks miss which names) and shown in
the engine thread's name, which ``distrun stacks`` prints.

Rounds pair up across ranks by their count, not by the thread that runs them: a caller that waits for its
own operation (a blocking call, ``synchronize``, a turn) runs the rounds itself under the round lock, and the
engine thread runs them only for work nobody waits on yet (``_async`` submissions, the optimizer's buckets),
gathering a burst of fusable submissions first: its round starts one ``HOROVOD_CYCLE_TIME`` after the last
of them (at most 8 cycles after the first), and at once for work that fuses with nothing. Beside entries
that their callers drive it sleeps, and backs off as when idle while drivers run the rounds.

Code that must issue on the data group itself (objects, join, barrier) takes a :class:`Turn`: an ordered
entry that, once agreed, holds the engine's data issue until released. While a rank has joined, ``join()``
sets :attr:`Engine.stand_in`, and the engine answers the others' named operations for it.

Two entry points for a failure and for the elastic reset:

* any exception in a round or in issuing turns into :class:`HorovodInternalError`, raised from every pending
  and later handle of that engine (never a hang: a peer's death ends the round's gloo exchange with an error,
  and ``HOROVOD_GLOO_TIMEOUT_SECONDS``, when set, bounds it);
* :func:`collectives.engines.reset_engines` fails every pending handle with :class:`HorovodInternalError`,
  stops the threads without talking to peers, and forgets the engines: the next operation on a fresh process
  group starts a new one. :func:`collectives.engines.shutdown_engines` is the orderly stop that every rank
  makes together.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from collectives.engine_announce import announce, name_key, ride_budget
from collectives.engine_cache import Marks, capacity_from_env
from collectives.engine_entries import Agreed, Entry, cached_items
from collectives.engine_lock import RoundLock
from collectives.engine_pace import MAX_IDLE_WAIT_S, burst_deadline, next_waits
from collectives.engine_reports import StallCheck, attempt, failure_message
from collectives.engine_rounds import Riders, Table, exchange
from collectives.engine_tickets import Ticket, Turn, settle_all
from collectives.engine_values import Fusion, Settings
from collectives.errors import CollectivesError, HorovodInternalError
from collectives.negotiation import ROW, Agreement, Call, Kind, _verdict
from collectives.peer_loss import abort_nccl
from collectives.progress import progress_for
from collectives.registry import _Groups

__all__ = ["Engine", "Ticket", "Turn"]


# A round's wait when HOROVOD_GLOO_TIMEOUT_SECONDS is unset: collectives' default process-group timeout.
DEFAULT_ROUND_TIMEOUT_S = 1800.0


class Engine:
    """One process set's engine: its thread, its round table and its queue of agreed operations."""

    def __init__(self, groups: _Groups, settings: Settings) -> None:
        self.groups = groups
        self.settings = settings
        self.collectives_issued = 0  # data-group collectives issued; fusion shows as fewer of these
        self.reduced_in_round = 0  # allreduces reduced from the payloads their round carried
        self.rounds = 0  # agreement rounds run, by the engine thread or by callers that drive
        # Held directly where nothing waits or is notified: entering a Condition costs a Python call more.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._new: list[Entry] = []
        self._woken = False  # the engine thread was woken for what is in _new
        self._undriven = 0  # entries in _new that nobody drives: the engine thread's work
        # Something in _new that fuses with nothing (a gradient bucket, an agreement): no burst to wait for.
        self._urgent = False
        self._local: dict[int, Entry] = {}
        # Agreed operations in issue order: key, every rank's row and payload (or None), and the agreement
        # where the response cache knows it already.
        self._queue: collections.deque[Agreed] = collections.deque()
        self._table = Table(groups.size, capacity_from_env())
        self._marks = Marks(self._table.cache)  # the cached slots of what is in _new
        # Per response-cache slot (slots are numbered from 0), made once: its queue item, with no payloads.
        self._cached_items: list[Agreed] = []
        self._driven_local = 0  # entries in _local that their callers drive (the rest: the thread's work)
        self._ride_bytes = ride_budget(groups.size)  # payloads beyond go by the cache's bits
        self._sequence = 0
        self._submitted = 0
        self.progress = progress_for(groups.set_id)  # the latest operation issued, agreed and done
        self._peers_stopping: set[int] = set()  # positions whose engine announced its stop (a clean leave)
        self._held: Entry | None = None  # the agreed turn that has the data group
        self._stopping = False
        self._abandoned = False
        self.broken: HorovodInternalError | None = None  # what ended it, if anything (a peer is gone)
        self._device_set = False
        self._stalls = StallCheck(groups.set_id, settings.stall_check, settings.stall_check_s)
        # Held for each round and the issue that follows it, by the engine thread or a caller that drives.
        self._round_lock = RoundLock(self._cond)
        self._round_owner: int | None = None
        # Set by join() while this rank has joined: given another rank's row of a named operation, how this
        # rank takes part (None: it submits that operation itself, as a joined optimizer does its buckets).
        self.stand_in: Callable[[list[int]], Callable[[Agreement], Any] | None] | None = None
        self._last_round = 0.0
        self._first_new_at = 0.0
        self._last_new_at = 0.0
        self._thread = threading.Thread(target=self._run, name=self._thread_name(), daemon=True)
        self._thread.start()

    def _thread_name(self) -> str:
        base = f"collectives-engine-{self.groups.set_id}"
        return f"{base} (stalled: {self._stalls.text})" if self._stalls.text else base

    # -- submitting ---------------------------------------------------------------------------------------

    def submit(
        self,
        call: Call,
        start: Callable[[Agreement], Any] | None,
        *,
        named: bool,
        fusion: Fusion | None = None,
        cuda_tensor: torch.Tensor | None = None,
        drive: bool = False,
        row: list[int] | None = None,
    ) -> Ticket:
        """Enqueue ``call``; ``start(agreement)`` runs on the engine thread once every rank has submitted it.

        ``named``: keyed by ``call.name`` (any order across ranks), else by the set's ordered sequence.
        ``drive``: the caller blocks until then and runs the rounds itself (see :meth:`drive`).
        ``row``: ``row_of(call)``, when the caller keeps it at hand.
        """
        entry = self.enqueue(
            call, start, named=named, fusion=fusion, cuda_tensor=cuda_tensor, notify=not drive, row=row
        )
        if drive:
            self.drive(entry)
        return entry

    def agree(self, call: Call) -> Ticket:
        """An ordered entry that issues nothing: its ticket gives the agreement once every rank has reached it
        (the optimizer's check that every rank steps the same layout)."""
        return self.enqueue(call, None, named=False)

    def turn(self, call: Call) -> Turn:
        """An ordered entry that lends the data group to the caller once agreed (see :class:`Turn`)."""
        return Turn(self.enqueue(call, None, named=False, lends=True, notify=False), self)

    def enqueue(
        self,
        call: Call,
        start: Callable[[Agreement], Any] | None,
        *,
        named: bool,
        fusion: Fusion | None = None,
        lends: bool = False,
        cuda_tensor: torch.Tensor | None = None,
        notify: bool = True,
        row: list[int] | None = None,
    ) -> Entry:
        """:meth:`submit` without driving: ``notify`` wakes the engine thread for it (an ``_async``
        operation, called directly on its hot path: a burst's operation pays a Python call less)."""
        event = None
        if cuda_tensor is not None and cuda_tensor.is_cuda:
            # The engine thread issues on its own current stream: it must wait for the producer's kernels.
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(cuda_tensor.device))
        with self._mutex:
            if self.broken is not None:
                failed = Entry(self, 0, call, call.name or "", None)
                failed._settle(None, self.broken)
                return failed
            if named and call.name is not None:
                key, label = name_key(call.name), call.name
            else:
                self._sequence += 1
                key = -self._sequence
                label = call.name or f"{call.kind.name.lower()}.noname.{self._sequence}"
            device = cuda_tensor.device.index if event is not None and cuda_tensor is not None else None
            seq = self._submitted = self._submitted + 1
            entry = Entry(self, key, call, label, start, fusion, lends, event, device, not notify, row, seq)
            progress = self.progress
            progress.issued_seq, progress.issued_kind, progress.issued_name = seq, call.kind, label
            self._local[key] = entry
            if row is not None and key > 0:
                self._marks.mark(key, row)
            if not notify:
                self._driven_local += 1
            now = time.monotonic()
            if not self._new:
                self._first_new_at = now
            self._last_new_at = now
            self._new.append(entry)
            if notify:
                self._undriven += 1
                if fusion is None:
                    self._urgent = True
            if notify and (not self._woken or fusion is None):
                # The first of a burst wakes the engine thread, which then gathers the rest for one cycle:
                # a wake-up per submission would only hand the interpreter back and forth.
                self._woken = True
                self._cond.notify_all()
        return entry

    def _release(self, turn: Turn) -> None:
        with self._mutex:
            if self._held is turn._ticket:
                self._held = None
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        cycle = self.settings.cycle_time_s
        wait = idle_wait = cycle
        try:
            while True:
                with self._mutex:
                    # Entries that a caller drives are no work of this thread's: it sleeps beside them.
                    if not self._undriven and not self._stopping and not self._abandoned:
                        self._cond.wait(wait)
                    if self._abandoned:
                        return
                    # Horovod's cycle: a burst of submissions gathers for one round rather than trickling
                    # into several, each of which would fuse only part of it.
                    # The cycle runs on while submissions keep coming (one burst, one round), up to a few
                    # cycles from the first; a caller that waits meanwhile runs the round itself at once.
                    # An entry that fuses with nothing (a gradient bucket, an agreement) gains nothing from
                    # the wait: its round starts at once.
                    while self._undriven and not self._urgent and not self._stopping and not self._abandoned:
                        deadline = burst_deadline(self._first_new_at, self._last_new_at, cycle)
                        delay = deadline - time.monotonic()
                        if delay <= 0:
                            break
                        self._cond.wait(delay)
                # A caller's round under way takes what is new, and its release wakes this thread.
                taken = self._round_lock.try_acquire(MAX_IDLE_WAIT_S)
                try:
                    skip = not taken or self._driven_lately(wait)
                    if not skip:
                        busy, stop = self._round()
                finally:
                    if taken:
                        self._round_lock.release()
                if skip:
                    # A caller ran a round meanwhile (it drives), and what is new it drives itself: back off
                    # as when idle, rather than wake each cycle to contend with the drivers for the lock.
                    wait, idle_wait = next_waits(False, idle_wait, cycle)
                    continue
                if stop:
                    return
                wait, idle_wait = next_waits(busy, idle_wait, cycle)
        except BaseException as error:  # a round or an issue failed: every pending handle must hear of it
            self._fail_round(error)

    def _driven_lately(self, idle_wait: float) -> bool:
        with self._mutex:
            if self._stopping or self._undriven:
                return False
            return time.monotonic() - self._last_round < idle_wait

    def drive(self, ticket: Ticket) -> None:
        """Run rounds on the caller's thread until ``ticket`` is settled (a blocking call on the CPU).

        Rounds pair up across ranks by their count, whichever thread runs them, and the round lock keeps one
        process's rounds in one sequence; so the caller may run them itself and spare the two hand-offs
        through the engine thread that a blocking call of a few bytes otherwise pays for.
        """
        if threading.get_ident() in (self._thread.ident, self._round_owner):
            return  # inside a round (a start or a callback): the round under way settles the ticket
        while not ticket.done():
            with self._round_lock:
                if ticket.done():
                    return
                with self._mutex:
                    if self._abandoned or self.broken is not None:
                        return
                try:
                    _, stop = self._round()
                except BaseException as error:
                    self._fail_round(error)
                    return
                if stop:
                    return

    def _round(self) -> tuple[bool, bool]:
        """One agreement round and the issue of what became ready; (whether there is work, whether every
        rank has stopped). The caller holds the round lock."""
        self._round_owner = threading.get_ident()
        try:
            return self._round_locked()
        finally:
            self._round_owner = None
            self._last_round = time.monotonic()

    def _round_locked(self) -> tuple[bool, bool]:
        self.rounds += 1
        with self._mutex:
            new, self._new = self._new, []
            marked = self._marks.take(len(new))
            self._undriven = 0
            self._urgent = False
            self._woken = False
            stop = self._stopping
        # A caller that waits has submitted its burst; a round the engine thread starts on its own may hold
        # part of one still being submitted, whose block would differ from the other ranks' and be wasted.
        driven = threading.get_ident() != self._thread.ident
        mine, bits, block = announce(self._table.cache, new, self._ride_bytes, marked, block=driven)
        timeout = self.settings.gloo_timeout_s
        table = self._table
        result = exchange(
            table,
            mine,
            width=1 + ROW,
            stop=stop,
            group=self.groups.engine,
            # Bounded: a peer that stops answering without closing its connections still ends the round.
            timeout=datetime.timedelta(seconds=timeout if timeout is not None else DEFAULT_ROUND_TIMEOUT_S),
            bits=bits,
            block=block,
        )
        self._peers_stopping.update(result.stopping)
        queue = self._queue
        for key in result.ready:
            payloads = table.take_payloads(key)
            queue.append((key, table.take(key), payloads, None))
        if result.riders is not None:
            queue.append((0, [], result.riders, None))  # every ready cached operation of the round
        elif result.cached:
            items = cached_items(self._cached_items, table.cache)
            if table.payloads:
                take = table.take_payloads
                for slot in result.cached:
                    key, rows, _, agreement = items[slot]
                    queue.append((key, rows, take(key), agreement))
            else:
                # The same queue item every step, queued in C: no allocation or Python step per operation.
                queue.extend(map(items.__getitem__, result.cached))
        if self.stand_in is not None:
            self._stand_in_for_named()
        self._execute()
        # Work left that only the engine thread's rounds move on (collectives.engine_pace): entries nobody
        # drives (async submissions not all ranks have made) and agreed operations behind a turn. Drivers run
        # their own rounds, and a round of the engine thread beside them costs the next driven call a round.
        with self._mutex:
            busy = bool(self._queue) or len(self._local) > self._driven_local
        if self._stalls.run(self._table, self.groups.ranks, self.groups.index, time.monotonic()):
            self._thread.name = self._thread_name()
        if result.stop:
            self._fail_all(HorovodInternalError("collectives shut down with this operation pending"))
            with self._mutex:
                self._abandoned = True
                self._cond.notify_all()
        return busy, result.stop

    def _stand_in_for_named(self) -> None:
        """While this rank has joined, answer each named operation the others have submitted with a JOIN
        row, as Horovod's coordinator counts a joined rank in; once agreed, ``stand_in`` takes part."""
        assert self.stand_in is not None
        me = self.groups.index
        assert me is not None  # an engine runs on its set's members only
        with self._mutex:
            for key, row in list(self._table.seen_without(me)):
                if key < 0 or key in self._local:
                    continue
                start = self.stand_in(row)
                if start is None:
                    continue
                label = self._table.labels.get(key, f"key {key}")
                entry = Entry(None, key, Call(Kind.JOIN), label, start)
                self._local[key] = entry
                self._new.append(entry)
                self._undriven += 1

    def _fail_round(self, error: BaseException) -> None:
        if not self._abandoned:
            stopping = set() if self._stopping else self._peers_stopping - {self.groups.index}
            with self._mutex:
                waiting = [e.label for e in self._local.values() if e.seq]
            left = sorted(self.groups.ranks[p] for p in stopping)
            self._fail_all(HorovodInternalError(failure_message(self.groups.set_id, error, left, waiting)))
            abort_nccl(self.groups)
        with self._mutex:
            self._abandoned = True
            self._cond.notify_all()

    def _execute(self) -> None:
        """Issue agreed operations in agreed order, fusing runs of fusable allreduces."""
        while self._queue:
            with self._mutex:
                if self._held is not None or self._abandoned:
                    return
            key, rows, payloads, agreement = self._queue.popleft()
            if isinstance(payloads, Riders):
                self._reduce_riders(payloads)
                continue
            with self._mutex:
                entry = self._forget(key)
            progress = self.progress
            if entry.seq:
                progress.negotiated_seq, progress.negotiated_kind = entry.seq, entry.call.kind
                progress.negotiated_name = entry.label
            if agreement is None:
                try:
                    agreement = _verdict(entry.call, self.groups, rows)
                except CollectivesError as error:
                    entry._settle(None, error)
                    continue
            if entry.cuda_event is not None:
                if not self._device_set and threading.current_thread() is self._thread:
                    # The engine thread's current device and stream are those of the rank's GPU.
                    torch.cuda.set_device(
                        torch.cuda.current_device() if entry.device is None else entry.device
                    )
                    self._device_set = True
                torch.cuda.current_stream().wait_event(entry.cuda_event)
            if entry.lends:
                with self._mutex:
                    self._held = entry
                self._done(entry)
                entry._settle(agreement, None)
                continue
            if entry.start is None:
                self._done(entry)
                entry._settle(agreement, None)
                continue
            if payloads is not None and entry.fusion is not None and not agreement.joined:
                self._reduce_in_round(entry, payloads)
                self._done(entry)
                continue
            # With a rank joined, each operation is matched one by one by its zeros: no fusion.
            fusable = entry.fusion is not None and not agreement.joined
            fused = [entry, *self._fusable_after(entry)] if fusable else [entry]
            if len(fused) > 1:
                self._issue_fused(fused)
            else:
                self._issue(entry, agreement)
            self._done(fused[-1])

    def _done(self, entry: Entry) -> None:
        if entry.seq:
            progress = self.progress
            progress.done_seq, progress.done_kind = entry.seq, entry.call.kind
            progress.done_name = entry.label

    def _forget(self, key: int) -> Entry:
        entry = self._local.pop(key)  # the caller holds the mutex
        if entry.driven:
            self._driven_local -= 1
        return entry

    def _forget_all(self, keys: list[int]) -> list[Entry]:
        """:meth:`_forget` of each of ``keys``, a C call each: a round forgets a whole burst at once."""
        entries = list(map(self._local.pop, keys))  # the caller holds the mutex
        self._driven_local -= [entry.driven for entry in entries].count(True)
        return entries

    def _fusable_after(self, first: Entry) -> list[Entry]:
        """The queued entries right behind ``first`` that fuse with it, within the threshold."""
        assert first.fusion is not None
        taken: list[Entry] = []
        fusion_key = first.fusion.key
        total = first.fusion.nbytes
        threshold = self.settings.fusion_threshold
        queue, local = self._queue, self._local
        while queue:
            key, rows, payloads, cached = queue[0]
            entry = local.get(key)
            if entry is None or entry.fusion is None or entry.fusion.key != fusion_key:
                break
            if payloads is not None:
                break  # reduced from its payloads, on its own
            size = entry.fusion.nbytes
            if total + size > threshold:
                break
            mine = rows[0]
            # Every rank's row the same (the common case, and never a joined rank's): agreed, not joined.
            if cached is None and not all(row == mine for row in rows):
                try:
                    if _verdict(entry.call, self.groups, rows).joined:
                        break
                except CollectivesError:
                    break  # it fails on its own, in order
            queue.popleft()
            if entry.cuda_event is not None:
                torch.cuda.current_stream().wait_event(entry.cuda_event)
            taken.append(entry)
            total += size
        with self._mutex:
            self._forget_all([entry.key for entry in taken])
        return taken

    def _issue(self, entry: Entry, agreement: Agreement) -> None:
        start = entry.start
        assert start is not None
        done, value = attempt(entry, entry.label, lambda: start(agreement))
        if done:
            self.collectives_issued += 1
            entry._settle(value, None)

    def _reduce_in_round(self, entry: Entry, payloads: list[torch.Tensor]) -> None:
        fusion = entry.fusion
        assert fusion is not None and fusion.reduce is not None
        reduce = fusion.reduce
        done, value = attempt(entry, entry.label, lambda: reduce(fusion.tensor, payloads))
        if done:
            self.reduced_in_round += 1
            entry._settle(value, None)

    def _reduce_riders(self, riders: Riders) -> None:
        """Reduce a run of cached allreduces from the bytes that rode in their round, as one block."""
        with self._mutex:
            entries = self._forget_all(riders.keys)
        first, last = entries[0], entries[-1]
        # This rank's block was of these entries, and one fusion's (engine_announce.announce).
        fusion = first.fusion
        assert fusion is not None and fusion.reduce_block is not None
        reduce_block = fusion.reduce_block
        tensors = [e.fusion.tensor for e in entries if e.fusion is not None]
        progress = self.progress
        progress.negotiated_seq, progress.negotiated_kind = last.seq, last.call.kind
        progress.negotiated_name = last.label
        done, values = attempt(first, first.label, lambda: reduce_block(tensors, riders.payloads))
        if done:
            self.reduced_in_round += len(entries)
            settle_all(entries, values)
        else:
            for entry in entries[1:]:
                entry._settle(None, first._error)
        self._table.give_back(riders.received)
        self._done(last)

    def _issue_fused(self, entries: list[Entry]) -> None:
        first = entries[0].fusion
        assert first is not None
        try:
            values = first.issue([e.fusion.tensor for e in entries if e.fusion is not None])
        except Exception as error:
            failure = HorovodInternalError(f"fused allreduce: {type(error).__name__}: {error}")
            for entry in entries:
                entry._settle(None, failure)
            return
        self.collectives_issued += 1
        for entry, value in zip(entries, values, strict=True):
            entry._settle(value, None)

    def stall_report(self) -> str:
        """The last stall check's finding: which ranks miss which names ("" when nothing stalls)."""
        return self._stalls.text

    # -- failing and stopping -------------------------------------------------------------------------------

    def _fail_all(self, error: HorovodInternalError) -> None:
        with self._mutex:
            if self.broken is None:
                self.broken = error
            entries = list(self._local.values())
            self._local.clear()
            self._driven_local = 0
            self._new.clear()
            self._marks.take(0)
            self._undriven = 0
            self._queue.clear()
            self._held = None
            self._cond.notify_all()
        for entry in entries:
            entry._settle(None, error)

    def shutdown(self, wait_s: float | None) -> None:
        """Stop together with the other ranks' engines (a round in which all ask to stop); every pending
        handle fails with :class:`HorovodInternalError`. ``wait_s`` bounds the wait for the thread."""
        with self._mutex:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.reset(HorovodInternalError("collectives shut down before the other ranks' engines stopped"))

    def reset(self, error: HorovodInternalError) -> None:
        """Fail every pending handle with ``error`` and stop the thread without talking to any peer."""
        self._fail_all(error)
        with self._mutex:
            self._abandoned = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            # A thread inside a gloo exchange leaves when the old group is aborted or its peer is gone; it
            # is a daemon and touches nothing once abandoned.
            self._thread.join(1.0)
