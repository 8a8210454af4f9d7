"""The snapshot state machine of replicated subscriptions, driven through random interleavings.

A model of N clusters, each with its log of entries and a FIFO replication channel to every
other cluster (what the replicators guarantee), runs the markers through
:class:`SnapshotCoordinator` exactly as the broker does: requests written by the source,
answered by each remote with the request's position in its own log, responses fed back. The
property that makes failover safe is checked on every snapshot: every entry of a remote's log
up to the position the snapshot names for it is in the source's log at or before the snapshot's
local position. So a subscription whose mark-delete position reached the local position has
acknowledged everything the remote copy holds up to there, and the remote may move its copy of
the subscription there without passing any unacknowledged message.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshared.broker.replication.snapshots import (
    SnapshotCache,
    SnapshotCoordinator,
    position_for,
)
from keyshared.protocol.markers import (
    ClusterPosition,
    Marker,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
)


@dataclass
class _Entry:
    uid: int
    origin: str
    marker: Marker | None = None
    replicate_to: tuple[str, ...] = ()


@dataclass
class _Cluster:
    name: str
    log: list[_Entry] = field(default_factory=list)


class _World:
    def __init__(self, n: int) -> None:
        self.names = [f"c{i}" for i in range(n)]
        self.clusters = {c: _Cluster(c) for c in self.names}
        self.channels: dict[tuple[str, str], deque[_Entry]] = {
            (x, y): deque() for x in self.names for y in self.names if x != y
        }
        self.uids = itertools.count()
        ids = itertools.count()
        self.source = self.names[0]
        self.coordinator = SnapshotCoordinator(self.source, 10_000, lambda: f"s{next(ids)}")
        self.snapshots: list[Snapshot] = []
        self.data = 0

    def write(self, at: str, entry: _Entry) -> int:
        log = self.clusters[at].log
        log.append(entry)
        if entry.origin == at:  # replicated entries are never forwarded again
            for other in self.names:
                if other != at and (not entry.replicate_to or other in entry.replicate_to):
                    self.channels[(at, other)].append(entry)
        return len(log) - 1

    def publish(self, at: str) -> None:
        self.write(at, _Entry(next(self.uids), at))
        if at == self.source:
            self.data += 1

    def marker(self, at: str, marker: Marker, replicate_to: tuple[str, ...] = ()) -> None:
        self.write(at, _Entry(next(self.uids), at, marker, replicate_to))

    def tick(self, now: int, all_connected: bool = True) -> None:
        remotes = [c for c in self.names if c != self.source]
        request = self.coordinator.tick(now, remotes, all_connected, self.data)
        if request is not None:
            self.marker(self.source, request)

    def deliver(self, channel: tuple[str, str], now: int) -> None:
        queue = self.channels[channel]
        if not queue:
            return
        entry = queue.popleft()
        at = channel[1]
        pos = self.write(at, entry)
        m = entry.marker
        if isinstance(m, SnapshotRequest):
            reply = SnapshotResponse(m.snapshot_id, ClusterPosition(at, 0, pos))
            self.marker(at, reply, (m.source_cluster,))
        elif isinstance(m, SnapshotResponse) and at == self.source:
            step = self.coordinator.on_response((0, pos), m, now)
            if isinstance(step, SnapshotRequest):
                self.marker(at, step)
            elif isinstance(step, Snapshot):
                self.check(step)
                self.snapshots.append(step)

    def check(self, snap: Snapshot) -> None:
        assert snap.local is not None
        local_upto = {e.uid for e in self.clusters[self.source].log[: snap.local[1] + 1]}
        assert {c.cluster for c in snap.clusters} == set(self.names) - {self.source}
        for c in snap.clusters:
            for e in self.clusters[c.cluster].log[: c.entry_id + 1]:
                if e.marker is None:
                    assert e.uid in local_upto, (
                        f"{c.cluster} entry {e.uid} (from {e.origin}) up to its snapshot "
                        f"position {c.entry_id} is not in {self.source} by {snap.local}"
                    )


@settings(max_examples=120, deadline=None)
@given(st.integers(min_value=2, max_value=4), st.data())
def test_every_snapshot_covers_what_the_remotes_hold(n: int, data: st.DataObject) -> None:
    w = _World(n)
    channels = list(w.channels)
    now = 0
    for _ in range(data.draw(st.integers(min_value=10, max_value=150))):
        now += 1
        step = data.draw(st.integers(min_value=0, max_value=9))
        if step <= 2:
            w.publish(data.draw(st.sampled_from(w.names)))
        elif step == 3:
            w.tick(now)
        else:
            w.deliver(data.draw(st.sampled_from(channels)), now)
    # Quiesce: everything in flight arrives, so pending snapshots complete.
    while any(w.channels.values()):
        for ch in channels:
            w.deliver(ch, now)
    # ... and every snapshot started completed (none timed out: the clock stayed short).
    assert not w.coordinator.pending
    assert len(w.snapshots) == w.coordinator.completed


def test_a_quiet_round_trip_completes_one_snapshot_with_two_rounds_for_three_clusters() -> None:
    for n, rounds in ((2, 1), (3, 2)):
        w = _World(n)
        w.publish(w.source)
        w.tick(1)
        requests = 0
        while any(w.channels.values()):
            for ch in list(w.channels):
                head = w.channels[ch][0] if w.channels[ch] else None
                if head is not None and isinstance(head.marker, SnapshotRequest):
                    requests += ch[0] == w.source
                w.deliver(ch, 2)
        assert len(w.snapshots) == 1 and w.coordinator.completed == 1
        assert requests == rounds * (n - 1)


def test_when_snapshots_start() -> None:
    w = _World(2)
    w.tick(1)
    assert not w.coordinator.pending, "no data yet"
    w.publish(w.source)
    w.tick(2, all_connected=False)
    assert not w.coordinator.pending, "a replicator is down"
    w.tick(3)
    assert len(w.coordinator.pending) == 1
    w.tick(4)
    assert len(w.coordinator.pending) == 1, "none completed yet: wait for the pending one"
    w.tick(10_005)
    assert len(w.coordinator.pending) == 1 and w.coordinator.timed_out == 1
    while any(w.channels.values()):
        for ch in list(w.channels):
            w.deliver(ch, 10_006)
    assert w.coordinator.completed == 1  # the second request's answer
    w.tick(10_007)
    assert not w.coordinator.pending, "no new data since the completed one started"
    w.publish(w.source)
    w.tick(10_008)
    w.tick(10_009)
    assert len(w.coordinator.pending) == 2, "once one completed, one per tick"


def test_late_and_repeated_answers_are_ignored() -> None:
    c = SnapshotCoordinator("a", 1000, lambda: "s1")
    assert c.tick(0, ["b"], True, 1) == SnapshotRequest("s1", "a")
    answer = SnapshotResponse("s1", ClusterPosition("b", 5, 6))
    assert c.on_response((1, 2), SnapshotResponse("other", answer.cluster), 1) is None
    assert c.on_response((1, 2), SnapshotResponse("s1", ClusterPosition("x", 1, 1)), 1) is None
    snap = c.on_response((1, 3), answer, 1)
    assert snap == Snapshot("s1", (1, 3), (ClusterPosition("b", 5, 6),))
    assert c.on_response((1, 4), answer, 1) is None


positions = st.tuples(st.integers(0, 3), st.integers(0, 20))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=5),
    st.lists(st.one_of(st.tuples(st.just("add"), positions), st.tuples(st.just("md"), positions))),
)
def test_cache_gives_the_newest_snapshot_passed(
    max_size: int, ops: list[tuple[str, tuple[int, int]]]
) -> None:
    cache = SnapshotCache(max_size)
    model: dict[tuple[int, int], Snapshot] = {}
    for op, pos in ops:
        if op == "add":
            snap = Snapshot(f"s{pos}", pos, (ClusterPosition("b", *pos),))
            cache.add(snap)
            model.setdefault(pos, snap)
            for old in sorted(model)[: max(0, len(model) - max_size)]:
                del model[old]
        else:
            passed = [p for p in model if p <= pos]
            expected = model[max(passed)] if passed else None
            for p in passed:
                del model[p]
            got = cache.advanced(pos)
            assert got == expected
            if got is not None:
                assert position_for(got.clusters, "b") == got.local
        assert len(cache) == len(model) <= max_size


def test_second_round_keeps_the_first_rounds_remote_positions() -> None:
    # c2 writes m after answering the second request; m reaches c1 before c1's second request
    # does, and c1's second answer reaches c0 before m. c1's second-round position covers m,
    # c0's snapshot position does not: the snapshot must name c1's first-round position.
    w = _World(3)
    a, b, c = w.names
    w.publish(a)
    w.deliver((a, b), 0)
    w.deliver((a, c), 0)
    w.tick(1)
    for ch in ((a, b), (a, c), (b, a), (c, a)):  # the first round
        w.deliver(ch, 2)
    assert w.channels[(a, b)] and w.channels[(a, c)], "second requests on their way"
    w.deliver((a, c), 3)  # c answers the second request
    w.publish(c)  # then writes m
    w.deliver((c, b), 4)  # m reaches b first
    w.deliver((a, b), 5)  # then the second request: b's answer is after m
    w.deliver((c, a), 6)
    w.deliver((b, a), 7)  # snapshot complete (check() ran), m still on its way to a
    assert len(w.snapshots) == 1 and w.channels[(c, a)]
