"""The pure decisions of backlog quotas and inactive-topic deletion, and their settings."""

from __future__ import annotations

import pytest

from keyshared.broker import backlog_quota as bq
from keyshared.broker import inactive_topics as it
from keyshared.config import BrokerConfig, ConfigError
from keyshared.storage.ledger import LedgerInfo
from keyshared.storage.position import Position


def test_quota_json_round_trip_and_deprecated_limit() -> None:
    quota = bq.BacklogQuota.from_json(
        {"limitSize": 10, "limitTime": 5, "policy": "producer_exception"}
    )
    assert quota == bq.BacklogQuota(10, 5, "producer_exception")
    assert quota.to_json() == {
        "limit": 10,
        "limitSize": 10,
        "limitTime": 5,
        "policy": "producer_exception",
    }
    # Pulsar's deprecated "limit" stands for limitSize when limitSize is absent.
    old = bq.BacklogQuota.from_json({"limit": 7, "policy": "consumer_backlog_eviction"})
    assert (old.limit_size, old.limit_time) == (7, -1)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"limitSize": 1}, "policy"),
        ({"limitSize": 1, "policy": "drop_everything"}, "drop_everything"),
        ({"limitSize": "1", "policy": "producer_exception"}, "limitSize"),
        ({"limitSize": -2, "policy": "producer_exception"}, "limitSize"),
        ({"limitTime": 2**31, "policy": "producer_exception"}, "limitTime"),
        ({"limitTime": True, "policy": "producer_exception"}, "limitTime"),
        ([1], "JSON object"),
    ],
)
def test_bad_quota_bodies_are_named(body: object, names: str) -> None:
    with pytest.raises(bq.QuotaError, match=names):
        bq.BacklogQuota.from_json(body)


def test_quota_type() -> None:
    assert bq.check_quota_type(None) == "destination_storage"
    assert bq.check_quota_type("message_age") == "message_age"
    with pytest.raises(bq.QuotaError, match="size"):
        bq.check_quota_type("size")


def test_default_quota_from_broker_conf() -> None:
    cfg = BrokerConfig()
    assert bq.default_quota(cfg) == bq.BacklogQuota(-1, -1, "producer_request_hold")
    cfg.set("backlogQuotaDefaultLimitGB", "0.5")
    assert bq.default_quota(cfg).limit_size == 512 * 1024 * 1024
    cfg.set("backlogQuotaDefaultLimitBytes", "1000")  # wins over the deprecated GB
    cfg.set("backlogQuotaDefaultLimitSecond", "30")
    cfg.set("backlogQuotaDefaultRetentionPolicy", "consumer_backlog_eviction")
    assert bq.default_quota(cfg) == bq.BacklogQuota(1000, 30, "consumer_backlog_eviction")


def test_related_pulsar_keys_are_reported_as_ignored() -> None:
    cfg = BrokerConfig()
    cfg.set("preciseTimeBasedBacklogQuotaCheck", "true")
    assert cfg.ignored_keys == ["preciseTimeBasedBacklogQuotaCheck"]
    assert "precisely" in cfg.warnings()[0]


def test_choices_are_checked_by_name() -> None:
    cfg = BrokerConfig()
    with pytest.raises(ConfigError, match="backlogQuotaDefaultRetentionPolicy"):
        cfg.set("backlogQuotaDefaultRetentionPolicy", "hold")
    with pytest.raises(ConfigError, match="brokerDeleteInactiveTopicsMode"):
        cfg.set("brokerDeleteInactiveTopicsMode", "always")
    with pytest.raises(ConfigError, match="backlogQuotaCheckIntervalInSeconds"):
        cfg.set("backlogQuotaCheckIntervalInSeconds", "0")


def test_estimated_backlog_size() -> None:
    ledgers = [LedgerInfo(1, 10, 1000), LedgerInfo(2, 4, 400), LedgerInfo(3, 0, 0)]
    assert bq.estimated_backlog_size(ledgers, None) == 0  # no durable cursor: no backlog
    assert bq.estimated_backlog_size(ledgers, Position(1, -1)) == 1400
    # Five of ledger 1's ten entries consumed: half of it counted, at the average entry size.
    assert bq.estimated_backlog_size(ledgers, Position(1, 4)) == 500 + 400
    assert bq.estimated_backlog_size(ledgers, Position(1, 9)) == 400
    assert bq.estimated_backlog_size(ledgers, Position(2, 3)) == 0
    # A mark-delete before the first ledger still there (trimmed): everything counts.
    assert bq.estimated_backlog_size(ledgers, Position(0, 5)) == 1400


def test_size_and_time_exceeded() -> None:
    assert not bq.size_exceeded(-1, 10**12)
    assert bq.size_exceeded(100, 100)  # Pulsar: reached is exceeded
    assert not bq.size_exceeded(100, 99)
    now = 100_000
    assert not bq.time_exceeded(-1, 0, now)
    assert not bq.time_exceeded(10, None, now)  # no backlog
    assert not bq.time_exceeded(10, now - 10_000, now)
    assert bq.time_exceeded(10, now - 10_001, now)


def test_size_eviction_skips_down_to_ninety_percent() -> None:
    # 2000 bytes over a 1000-byte quota, 20 entries: 1100/2000 of them go.
    assert bq.size_eviction_skip(2000, 1000, 20) == 11
    assert bq.size_eviction_skip(900, 1000, 20) == 0
    # Rounded up: a few large entries still get the backlog under 90 %.
    assert bq.size_eviction_skip(950, 1000, 20) == 2
    assert bq.size_eviction_skip(5160, 5000, 5) == 1
    assert bq.size_eviction_skip(0, 0, 0) == 0


def test_quota_against_retention() -> None:
    quota = bq.BacklogQuota(2 * 1024 * 1024, 600, "producer_exception")
    assert not bq.conflicts_with_retention(quota, None, None)
    assert bq.conflicts_with_retention(quota, None, 2)  # size at the retention size
    assert not bq.conflicts_with_retention(quota, None, 3)
    assert bq.conflicts_with_retention(quota, 10, None)  # 600 s = 10 min
    assert not bq.conflicts_with_retention(quota, -1, -1)
    assert not bq.conflicts_with_retention(bq.BacklogQuota(-1, -1, "producer_exception"), 1, 1)


def test_inactive_policies_json_and_defaults() -> None:
    body = {
        "inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up",
        "maxInactiveDurationSeconds": 5,
        "deleteWhileInactive": True,
    }
    assert it.InactiveTopicPolicies.from_json(body).to_json() == body
    for bad, name in (
        ({"inactiveTopicDeleteMode": "never"}, "never"),
        ({"maxInactiveDurationSeconds": -1}, "maxInactiveDurationSeconds"),
        ({"deleteWhileInactive": "yes"}, "deleteWhileInactive"),
    ):
        with pytest.raises(it.InactivePolicyError, match=name):
            it.InactiveTopicPolicies.from_json(bad)
    cfg = BrokerConfig()
    assert it.broker_policies(cfg) == it.InactiveTopicPolicies(
        "delete_when_no_subscriptions", 60, True
    )
    cfg.set("brokerDeleteInactiveTopicsFrequencySeconds", "7")
    assert it.broker_policies(cfg).max_inactive_seconds == 7  # the frequency, when not set
    cfg.set("brokerDeleteInactiveTopicsMaxInactiveDurationSeconds", "30")
    assert it.broker_policies(cfg).max_inactive_seconds == 30


def test_activity_by_mode() -> None:
    no_subs, caught_up = "delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"
    assert it.is_active(no_subs, subscriptions=1, backlog=0, connected=0)
    assert not it.is_active(caught_up, subscriptions=1, backlog=0, connected=0)
    assert it.is_active(caught_up, subscriptions=1, backlog=3, connected=0)
    assert not it.is_active(no_subs, subscriptions=0, backlog=0, connected=0)
    assert it.is_active(no_subs, subscriptions=0, backlog=0, connected=1)


def test_deletion_waits_for_duration_and_retention() -> None:
    policy = it.InactiveTopicPolicies("delete_when_no_subscriptions", 60, True)
    assert not it.should_delete(policy, 59, 0)
    assert it.should_delete(policy, 60, 0)
    assert not it.should_delete(policy, 600, -1)  # infinite retention keeps the topic
    assert not it.should_delete(policy, 600, 11)  # retained 11 minutes after last use
    assert it.should_delete(policy, 660, 11)
    off = it.InactiveTopicPolicies("delete_when_no_subscriptions", 0, False)
    assert not it.should_delete(off, 10**6, 0)
