"""A persistent topic's stats and internal stats, with Pulsar's field names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keyshared.broker.topic_common import producer_stats

if TYPE_CHECKING:
    from keyshared.broker.topic import PersistentTopic


def topic_stats(topic: PersistentTopic) -> dict[str, Any]:
    """TopicStats with Pulsar's field names."""
    publishers = [producer_stats(p) for p in topic.producers.values()]
    subs = {name: s.stats() for name, s in topic.subscriptions.items()}
    backlog_size = topic.backlog_quota.backlog_size()
    rate_in, throughput_in = topic.rates_in.rates(topic.msg_in_counter, topic.bytes_in_counter)
    return {
        "msgRateIn": rate_in,
        "msgThroughputIn": throughput_in,
        # As Pulsar: what the topic sends is what its subscriptions send.
        "msgRateOut": sum(s["msgRateOut"] for s in subs.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subs.values()),
        "bytesInCounter": topic.bytes_in_counter,
        "msgInCounter": topic.msg_in_counter,
        "bytesOutCounter": topic.bytes_out_counter,
        "msgOutCounter": topic.msg_out_counter,
        "averageMsgSize": (topic.bytes_in_counter / topic.msg_in_counter)
        if topic.msg_in_counter
        else 0.0,
        "msgChunkPublished": False,
        "storageSize": topic.ledger.total_size,
        "backlogSize": backlog_size,
        "publishRateLimitedTimes": topic.service.rate_limits.publish_limited_times(topic.name),
        "earliestMsgPublishTimeInBacklogs": 0,
        "offloadedStorageSize": 0,
        "waitingPublishers": topic.producers.access.waiting_count,
        "topicEpoch": topic.producers.access.topic_epoch,
        "publishers": publishers,
        "subscriptions": subs,
        "replication": topic.replication.stats(),
        "deduplicationStatus": "Enabled" if topic.dedup is not None else "Disabled",
        "nonContiguousDeletedMessagesRanges": sum(
            s["nonContiguousDeletedMessagesRanges"] for s in subs.values()
        ),
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "topicCreationTimeStamp": 0,
        "lastPublishTimeStamp": 0,
        **topic.backlog_quota.stats(),
    }


def topic_internal_stats(topic: PersistentTopic) -> dict[str, Any]:
    """PersistentTopicInternalStats with Pulsar's field names."""
    ledger = topic.ledger
    cursors = {}
    for name, sub in topic.subscriptions.items():
        c = sub.cursor.internal_stats()
        disp = sub.dispatcher
        c["subscriptionHavePendingRead"] = bool(disp and disp.have_pending_read)
        c["subscriptionHavePendingReplayRead"] = bool(disp and disp.have_pending_replay_read)
        cursors[name] = c
    for rep in topic.replication.replicators.values():
        cursors[rep.cursor.name] = rep.cursor.internal_stats()
    return {
        "entriesAddedCounter": ledger.number_of_entries,
        "numberOfEntries": ledger.number_of_entries,
        "totalSize": ledger.total_size,
        "currentLedgerEntries": ledger.ledgers[-1].entries if ledger.ledgers else 0,
        "currentLedgerSize": ledger.ledgers[-1].size if ledger.ledgers else 0,
        "lastLedgerCreatedTimestamp": "",
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": str(ledger.last_add_confirmed),
        # Pulsar's ManagedLedgerImpl.State: ClosedLedger while no ledger takes appends
        # (the disk is full, or a ledger could not be created).
        "state": "LedgerOpened" if ledger.current_ledger_id >= 0 else "ClosedLedger",
        "ledgers": [
            {
                "ledgerId": li.ledger_id,
                "entries": li.entries,
                "size": li.size,
                "offloaded": False,
            }
            for li in ledger.ledgers
        ],
        "cursors": cursors,
    }
