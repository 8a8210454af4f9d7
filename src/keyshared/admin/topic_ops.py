"""Admin operations on loaded topics that are more than one broker call: unload, and finding
the entry that peek (n-th unacked of a subscription) and examine (n-th from either end) mean.

Peek and examine are *specified* reads: they read one entry by position and never touch a
cursor's read position or epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.service import BrokerService
    from keyshared.broker.subscription import Subscription
    from keyshared.broker.topic import PersistentTopic
    from keyshared.storage.ledger import ManagedLedger


async def unload_topic(service: BrokerService, topic: PersistentTopic) -> None:
    """Pulsar's unload: close the topic (clients are told to reconnect; cursors, dedup state and
    pending appends are persisted) and forget it; the next use loads it again from storage,
    with the policies in force then."""
    if topic.closed:
        return
    await topic.close()
    if service.topics.get(topic.name.full) is topic:
        del service.topics[topic.name.full]
    # A replicated topic is loaded again at once, so that its replicators go on without
    # waiting for a client (as the broker that takes over a bundle loads replicated topics).
    service.load_replicated_topics()


def nth_unacked(sub: Subscription, n: int) -> Position | None:
    """The position of the ``n``-th (1-based) entry after the mark-delete position that is not
    individually acked, or None when there are fewer."""
    cursor = sub.cursor
    if n > cursor.number_of_entries_in_backlog:
        return None
    ledger = sub.topic.ledger
    acked = cursor.individually_deleted
    lac = ledger.last_add_confirmed
    pos = ledger.next_position(cursor.mark_delete_position)
    seen = 0
    while pos <= lac:
        r = acked.range_containing(pos)
        if r is not None:
            pos = ledger.next_position(r[1])
            continue
        seen += 1
        if seen == n:
            return pos
        pos = ledger.next_position(pos)
    return None


def nth_entry(ledger: ManagedLedger, n: int, *, from_latest: bool) -> Position | None:
    """The ``n``-th (1-based) durable entry counted from the first (or from the last), or None
    when the ledger holds fewer."""
    spans = [(info.ledger_id, info.entries) for info in ledger.ledgers if info.entries > 0]
    if from_latest:
        spans.reverse()
    left = n - 1
    for ledger_id, entries in spans:
        if left < entries:
            return Position(ledger_id, entries - 1 - left if from_latest else left)
        left -= entries
    return None
