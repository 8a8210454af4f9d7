"""The snapshot state machine of replicated subscriptions, pure and synchronous.

Pulsar's ``ReplicatedSubscriptionsController``, ``...SnapshotBuilder`` and ``...SnapshotCache``,
without I/O: the caller writes the markers these return and feeds back what it reads.

A snapshot of a topic replicated among clusters pairs a *local* position with one position per
remote cluster, such that once a subscription's local mark-delete position has reached the
local one, every entry of each remote copy up to its position has been acknowledged here. It is
taken by markers travelling through the topic itself, which replication keeps in order:

1. the source writes a *request* into its topic; it is replicated to every remote;
2. each remote answers with a *response* naming the position of the request in its own copy
   (everything before that in the remote copy reached the source before the request left it,
   or is on its way back ahead of the response); the response is replicated to the source;
3. once every remote answered, the source stores the *snapshot* (local position: that of the
   last response, after which everything the remotes listed is in the local copy). With more
   than one remote it asks a second time first, as Pulsar does, so that each remote's position
   also covers what the others forwarded to it before answering the first round.

:class:`SnapshotCache` keeps the snapshots a subscription's dispatcher read; when its mark-delete
position passes one, the newest passed snapshot's remote positions go out in an *update*.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from keyshared.protocol.markers import (
    ClusterPosition,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
    clusters_of,
)

Pos = tuple[int, int]
"""An entry position ``(ledger_id, entry_id)``."""


@dataclass(slots=True)
class SnapshotBuilder:
    """One snapshot being taken (Pulsar's ``ReplicatedSubscriptionsSnapshotBuilder``)."""

    snapshot_id: str
    local: str
    remotes: frozenset[str]
    started_ms: int
    data_mark: int
    """The topic's data counter when the snapshot started (see :class:`SnapshotCoordinator`)."""
    missing: set[str] = field(default_factory=set)
    positions: dict[str, Pos] = field(default_factory=dict)
    rounds_left: int = 1

    def __post_init__(self) -> None:
        self.missing = set(self.remotes)
        self.rounds_left = 2 if len(self.remotes) > 1 else 1

    def request(self) -> SnapshotRequest:
        """The request marker to write (again for the second round)."""
        return SnapshotRequest(self.snapshot_id, self.local)

    def on_response(
        self, position: Pos, response: SnapshotResponse
    ) -> SnapshotRequest | Snapshot | None:
        """A response was stored locally at ``position``: None while answers are missing, the
        request of the second round, or the finished snapshot."""
        c = response.cluster
        if c is None or c.cluster not in self.missing:
            return None  # a resend, or a cluster this snapshot did not ask
        self.missing.discard(c.cluster)
        # The first round's positions are kept: the second round only moves the local
        # position past what each remote forwarded to the others before it answered.
        self.positions.setdefault(c.cluster, (c.ledger_id, c.entry_id))
        if self.missing:
            return None
        self.rounds_left -= 1
        if self.rounds_left > 0:
            self.missing = set(self.remotes)
            return self.request()
        return Snapshot(self.snapshot_id, position, clusters_of(self.positions.items()))


@dataclass(slots=True)
class SnapshotCoordinator:
    """When to start snapshots and which are pending, for one topic.

    Pulsar's rules: a snapshot starts every ``replicatedSubscriptionsSnapshotFrequencyMillis``
    only when every replicator is connected and data was written since the last completed
    snapshot started (``data_counter`` counts data entries, markers excluded); until one has
    completed, a new one waits for the pending one to time out (a remote that does not answer
    is not asked every second); pending ones are dropped after the timeout.
    """

    local: str
    timeout_ms: int
    new_id: Callable[[], str]
    pending: dict[str, SnapshotBuilder] = field(default_factory=dict)
    completed: int = 0
    timed_out: int = 0
    last_completed_id: str | None = None
    _covered_mark: int = 0
    _ever_completed: bool = False

    def tick(
        self, now_ms: int, remotes: Iterable[str], all_connected: bool, data_counter: int
    ) -> SnapshotRequest | None:
        """A timer tick: the request marker of a new snapshot, or None."""
        self._expire(now_ms)
        clusters = frozenset(remotes)
        if not clusters or not all_connected:
            return None
        if not self._ever_completed and self.pending:
            return None
        if data_counter == self._covered_mark:
            return None
        b = SnapshotBuilder(self.new_id(), self.local, clusters, now_ms, data_counter)
        self.pending[b.snapshot_id] = b
        return b.request()

    def on_response(
        self, position: Pos, response: SnapshotResponse, now_ms: int
    ) -> SnapshotRequest | Snapshot | None:
        """A response stored locally at ``position``: a request to write again (second
        round), the snapshot to store, or None."""
        self._expire(now_ms)
        b = self.pending.get(response.snapshot_id)
        if b is None:
            return None  # late answer to a timed-out snapshot, or not ours
        step = b.on_response(position, response)
        if isinstance(step, Snapshot):
            del self.pending[b.snapshot_id]
            self.completed += 1
            self.last_completed_id = b.snapshot_id
            self._ever_completed = True
            self._covered_mark = max(self._covered_mark, b.data_mark)
        return step

    def _expire(self, now_ms: int) -> None:
        for sid in [s for s, b in self.pending.items() if now_ms - b.started_ms > self.timeout_ms]:
            del self.pending[sid]
            self.timed_out += 1


class SnapshotCache:
    """The snapshots one replicated subscription read, by local position (Pulsar's
    ``ReplicatedSubscriptionSnapshotCache``): at most ``max_size``, the oldest dropped."""

    __slots__ = ("_keys", "_snapshots", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max(1, max_size)
        self._keys: list[Pos] = []
        self._snapshots: dict[Pos, Snapshot] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, snapshot: Snapshot) -> None:
        """Remember ``snapshot`` (read again after a rewind: kept once)."""
        pos = snapshot.local
        if pos is None or pos in self._snapshots:
            return
        bisect.insort(self._keys, pos)
        self._snapshots[pos] = snapshot
        while len(self._keys) > self.max_size:
            del self._snapshots[self._keys.pop(0)]

    def advanced(self, mark_delete: Pos) -> Snapshot | None:
        """The mark-delete position moved to ``mark_delete``: the newest snapshot it reached
        (it and the older ones are dropped), or None."""
        i = bisect.bisect_right(self._keys, mark_delete)
        if i == 0:
            return None
        found = self._snapshots[self._keys[i - 1]]
        for pos in self._keys[:i]:
            del self._snapshots[pos]
        del self._keys[:i]
        return found


def position_for(clusters: Iterable[ClusterPosition], cluster: str) -> Pos | None:
    """The position an update names for ``cluster``, if any."""
    for c in clusters:
        if c.cluster == cluster:
            return (c.ledger_id, c.entry_id)
    return None
