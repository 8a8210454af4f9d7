"""No idle stall: a consumer with permits is sent a deliverable entry without waiting for an ack.

Every ack, nack, FLOW and join makes the dispatcher read again, so a dispatcher that forgets to
read on its own (the unblocking timer that never fires, a parked normal read that keeps the
replay waiting) only delays delivery until the next client action, and a check that runs only
when everything is acked never sees it. This probe looks at the moment the clients go quiet;
:func:`at_rest` looks after every step of the schedule at which the broker is at rest.

At the end of a seed's schedule, before the final phase, the clients stop (no publish, ack,
nack, FLOW, join or leave). The broker alone goes on for ``keySharedUnblockingIntervalMs`` plus
one read: queued callbacks run, storage reads complete, and the timers due within
``keySharedUnblockingIntervalMs + dispatcherRetryBackoffMaxTimeInMs`` of the moment the clients
stopped fire (the unblocking timer, and the retry of a read that dispatched nothing). When that
comes to rest, no entry may be *deliverable*: unacked, not held by any client, and one that the
consumer its hash belongs to (the selector's choice) may take under the Key_Shared rules right
now, that is:

* the subscription is not blocked on maxUnackedMessagesPerSubscription;
* that consumer has dispatch permits (FLOW permits, room under maxUnackedMessagesPerConsumer, a
  writable connection);
* no other consumer holds an entry of the same hash (the hash is not draining towards it).

Classic seeds are probed too. While they were not, five of the 5,032 classic seeds of
``make test`` (4752, 4856, 9694, 14271, 14748) came to rest with an entry deliverable; each
was a real stall, now fixed: a replay round read only the queue's head when its consumers had
no permits (also with allowOutOfOrderDelivery, on both dispatchers; seed 4752 fails without
that fix), and the skip-once-to-read-ahead was spent while a normal read already waited at the
tail (a timeline test in test_classic_timelines.py).

Entries the broker has not read yet count only while it may read them: not while the look-ahead
limit is reached (Pulsar's keySharedLookAheadMsgInReplayThreshold*) nor while dispatch is paused
on the ack state (PIP-299). allowOutOfOrderDelivery has no hash blocking, so only permits count.

The probe only runs the loop, the reads and the timers, as the schedule itself could have, so
the seed stays one real schedule; it is drawn from no random stream, so a failing seed replays
exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keyshared.storage.position import Position
from tests.sim.world import payload_meta

if TYPE_CHECKING:
    from tests.sim.simulator import Client, Simulation

# Loop steps (a callback, a read or a timer) a probe may take. Most settle within a few dozen;
# one that has not settled by then is a dispatcher retrying a read that sends nothing (a hash
# blocked while its consumer has permits, with dispatcherRetryBackoff* of 0 even without time
# passing): it is not idle, so the probe gives no verdict and the final phase takes over.
PROBE_LIMIT = 600
# How long (virtual seconds) the probe lets the broker retry before it stops looking.
HORIZON = 0.5


def probe(sim: Simulation) -> str | None:
    """Let the broker run alone, then the stall found (a message for the oracle), or None.

    Two looks: when ``keySharedUnblockingIntervalMs`` plus the longest read retry has passed,
    an entry one read can bring must be on its way (a read in flight or due, a callback
    queued); and once the broker comes to rest (no callback, read or timer left, within
    :data:`HORIZON`), no entry may be deliverable at all.
    """
    disp = sim.dispatcher
    if disp is None or not sim.live:
        return None
    cfg = sim.config
    window = (cfg.keySharedUnblockingIntervalMs + cfg.dispatcherRetryBackoffMaxTimeInMs) / 1000.0
    t0 = sim.loop.now
    sim.note(f"--- clients idle: the broker runs alone from t={t0 * 1000:.0f}ms ---")
    if not _run_until(sim, t0 + window):
        return None
    if not _busy(sim):
        stalled = deliverable(sim, one_read=True)
        if stalled:
            return _report(sim, stalled, f"{window * 1000:.0f}ms later the broker is idle")
    if not _run_until(sim, t0 + HORIZON):
        return None
    if _busy(sim):
        return None  # still retrying at the horizon: the final phase sees whether it ends
    stalled = deliverable(sim, one_read=False)
    if stalled:
        return _report(sim, stalled, "the broker came to rest")
    return None


def at_rest(sim: Simulation) -> str | None:
    """After every step of the schedule: the stall found if the broker is at rest now.

    At rest (no callback, storage read or timer due) the broker does nothing more until a
    client acts, exactly as at the end of :func:`probe`: an entry deliverable then is an idle
    stall wherever in the schedule it happens. The end-of-schedule probe alone sees a stall only
    if it happens to be the state the schedule ends in; the next client action of the schedule
    usually hides it (found this way: classic Key_Shared skipping a replay for a read ahead at
    the tail of the topic, on seed 17446; without this check the first seed to fail was 29933).
    Only looks, so the schedule is unchanged.
    """
    if sim.dispatcher is None or not sim.live or _busy(sim):
        return None
    stalled = deliverable(sim, one_read=False)
    if stalled:
        return _report(sim, stalled, "the broker came to rest mid-schedule")
    return None


def _run_until(sim: Simulation, deadline: float) -> bool:
    """Run callbacks, reads and the timers due by ``deadline``; False if it never settled."""
    loop = sim.loop
    reader = sim.reader
    for _ in range(PROBE_LIMIT):
        if loop.ready:
            sim.note(f"run {loop.ready[0]!r}")
            loop.run_one()
            continue
        if reader.pending_reads:
            read = reader.complete(0)
            sim.note(f"read done {read.start}+{read.max_entries}")
            continue
        at = loop.next_timer_at()
        if at is not None and at <= deadline + 1e-9:
            sim.note(f"timer at {at * 1000:.0f}ms")
            loop.fire_next_timer()
            continue
        return True
    return False


def _busy(sim: Simulation) -> bool:
    """Whether the broker will act without a client: a callback, storage read or timer is due.

    A normal read parked at the tail waiting for new entries is not: without a publish it never
    completes.
    """
    return bool(sim.loop.ready) or bool(sim.reader.pending_reads) or sim.loop.has_timer()


def _report(sim: Simulation, stalled: list[tuple[Position, Client]], when: str) -> str:
    shown = ", ".join(f"{pos} to {c}" for pos, c in stalled[:8])
    return (
        f"idle stall: the clients went quiet and {when}, with {shown} deliverable now to a "
        "consumer with permits\n" + sim.state()
    )


def deliverable(sim: Simulation, *, one_read: bool) -> list[tuple[Position, Client]]:
    """The entries some consumer with permits may take now, with that consumer.

    ``one_read``: of the entries not read yet, only the next one (one read brings it); the
    ones after it may take more reads (the read batch grows from dispatcherMinReadBatchSize and
    the look-ahead limit caps it).
    """
    disp = sim.dispatcher
    if disp is None:
        return []
    if disp.unacked_limit.blocked:
        # maxUnackedMessagesPerSubscription: nothing goes until the consumers ack down to half.
        return []
    cursor = sim.cursor
    mdp = cursor.mark_delete_position
    read_pos = cursor.read_position
    replay = disp.replay
    may_read = len(replay) < disp.look_ahead_limit()
    if sim.sub.should_pause_on_ack_state():
        may_read = False
    ordering = sim.params.ordering_keys
    # The hash of every entry a client holds, by holder: another consumer may not take it.
    held_by: dict[int, set[int]] = {}
    if sim.keyed:
        for c in sim.live:
            for held in c.held.values():
                slot = disp.slot_of(payload_meta(held.key, held.size, held.key in ordering))
                held_by.setdefault(slot, set()).add(id(c))
    # Classic: a recently joined consumer may take nothing after its join position until the
    # mark-delete position passes it (PIP-282; the seed's rule for join_position="read").
    joined = getattr(disp, "recently_joined", None)
    out: list[tuple[Position, Client]] = []
    next_read = False
    for pos in sim.order:
        if pos <= mdp or pos in sim.acked or pos in sim.holder or cursor.is_acked(pos):
            continue
        if pos >= read_pos and pos not in replay:
            # Not read yet: only if the broker may read on (and, for one read, the next one).
            if not may_read or (one_read and next_read):
                continue
            next_read = True
        key, size = sim.entries[pos]
        slot = disp.slot_of(payload_meta(key, size, key in ordering))
        owner = disp.selector.select(slot)
        if owner is None or owner.dispatch_permits() <= 0:
            continue
        client = sim.by_consumer.get(id(owner))
        if client is None or client.closed:
            continue
        holders = held_by.get(slot)
        if holders and holders != {id(client)}:
            continue
        if joined and _after_join(pos, joined, owner, pos in replay):
            continue
        out.append((pos, client))
    return out


def _after_join(pos: Position, joined: dict[Any, Position], owner: Any, replayed: bool) -> bool:
    """Whether the classic restriction keeps ``pos`` from its ``owner`` for now.

    A replayed entry is also held to the earliest join position of all, as Pulsar's classic
    dispatcher does for replay reads."""
    limit = joined.get(owner)
    if limit is None:
        return False
    if replayed:
        limit = min(limit, next(iter(joined.values())))
    return pos > limit
