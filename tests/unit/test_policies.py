"""The policy owner: topic over namespace over broker.conf, Pulsar's "unset", change listeners."""

from __future__ import annotations

from pathlib import Path

from keyshared.broker.policies import POLICIES, PolicyService
from keyshared.broker.topic_name import TopicName
from keyshared.config import BrokerConfig
from keyshared.storage.metadata import MetadataStore

TOPIC = TopicName.parse("persistent://public/default/t")


def service(tmp_path: Path, **settings: str) -> PolicyService:
    config = BrokerConfig()
    config.update(settings)
    policies = PolicyService(MetadataStore(tmp_path / "md.db", durable=False), config)
    policies.create_namespace("public/default")
    return policies


def test_topic_over_namespace_over_broker(tmp_path: Path) -> None:
    policies = service(tmp_path, ttlDurationDefaultInSeconds="30")
    assert policies.effective(TOPIC, "message_ttl_in_seconds") == 30
    policies.update_namespace("public/default", {"message_ttl_in_seconds": 60})
    assert policies.effective(TOPIC, "message_ttl_in_seconds") == 60
    policies.update_topic(TOPIC.full, {"message_ttl_in_seconds": 0})
    # 0 is a value (messages never expire), not "unset".
    assert policies.effective(TOPIC, "message_ttl_in_seconds") == 0
    policies.update_topic(TOPIC.full, {"message_ttl_in_seconds": None})
    assert policies.effective(TOPIC, "message_ttl_in_seconds") == 60
    assert policies.topic(TOPIC.full) == {}


def test_empty_subscription_types_list_is_unset(tmp_path: Path) -> None:
    policies = service(tmp_path, subscriptionTypesEnabled="Exclusive, Shared")
    assert policies.enabled_sub_types(TOPIC) == {"Exclusive", "Shared"}
    policies.update_namespace("public/default", {"subscription_types_enabled": ["Key_Shared"]})
    assert policies.enabled_sub_types(TOPIC) == {"Key_Shared"}
    policies.update_topic(TOPIC.full, {"subscription_types_enabled": ["Failover"]})
    assert policies.enabled_sub_types(TOPIC) == {"Failover"}
    policies.update_topic(TOPIC.full, {"subscription_types_enabled": []})
    policies.update_namespace("public/default", {"subscription_types_enabled": []})
    assert policies.topic_value(TOPIC.full, "subscription_types_enabled") is None
    assert policies.enabled_sub_types(TOPIC) == {"Exclusive", "Shared"}


def test_levels_keep_pulsars_field_names(tmp_path: Path) -> None:
    policies = service(tmp_path, brokerServiceCompactionThresholdInBytes="100")
    assert policies.effective(TOPIC, "compactionThreshold") == 100
    policies.update_namespace("public/default", {"compactionThreshold": 200})
    assert (policies.namespace("public/default") or {})["compaction_threshold"] == 200
    assert policies.effective(TOPIC, "compactionThreshold") == 200
    policies.update_topic(TOPIC.full, {"compactionThreshold": 300})
    assert policies.topic(TOPIC.full) == {"compactionThreshold": 300}
    assert policies.effective(TOPIC, "compactionThreshold") == 300


def test_every_policy_defaults_to_a_broker_setting(tmp_path: Path) -> None:
    policies = service(tmp_path)
    config = BrokerConfig()
    for name, policy in POLICIES.items():
        assert policies.effective(TOPIC, name) == policy.default(config), name


def test_map_policy_entries_resolve_one_by_one(tmp_path: Path) -> None:
    policies = service(tmp_path)
    size = {"limitSize": 10, "limitTime": -1, "policy": "producer_exception"}
    age = {"limitSize": -1, "limitTime": 5, "policy": "producer_request_hold"}
    assert policies.effective_entry(TOPIC, "backlogQuotaMap", "message_age") is None
    policies.update_namespace("public/default", {"backlogQuotaMap": {"destination_storage": size}})
    policies.update_topic(TOPIC.full, {"backlogQuotaMap": {"message_age": age}})
    # The topic's entry for one type, the namespace's for the other.
    assert policies.effective_entry(TOPIC, "backlogQuotaMap", "message_age") == age
    assert policies.effective_entry(TOPIC, "backlogQuotaMap", "destination_storage") == size
    assert policies.topic(TOPIC.full) == {"backLogQuotaMap": {"message_age": age}}


def test_every_change_reaches_the_listeners(tmp_path: Path) -> None:
    policies = service(tmp_path)
    seen: list[int] = []
    policies.add_listener(lambda: seen.append(policies.generation))
    policies.update_namespace("public/default", {"deduplicationEnabled": True})
    policies.update_topic(TOPIC.full, {"deduplicationEnabled": False})
    policies.delete_topic(TOPIC.full)
    policies.delete_namespace("public/default")
    assert len(seen) == 4 and seen == sorted(set(seen))
    assert not policies.namespace_exists("public/default")


def test_a_partitioned_topics_policy_reaches_its_partitions(tmp_path: Path) -> None:
    policies = service(tmp_path)
    base = TopicName.parse("persistent://public/default/p")
    part = base.partition(1)
    policies.update_topic(base.full, {"maxProducersPerTopic": 3})
    quota = {"limitSize": 10, "limitTime": -1, "policy": "producer_exception"}
    policies.update_topic(base.full, {"backlogQuotaMap": {"destination_storage": quota}})
    assert policies.effective(part, "maxProducersPerTopic") == 3
    assert policies.effective_entry(part, "backlogQuotaMap", "destination_storage") == quota
    # The partition's own policy, where set, comes first.
    policies.update_topic(part.full, {"maxProducersPerTopic": 5})
    assert policies.effective(part, "maxProducersPerTopic") == 5
    rate = {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}
    policies.update_topic(base.full, {"publishRate": rate})
    assert policies.effective(part, "publishRate") == rate


def test_rates_are_per_cluster_and_unset_without_a_positive_limit(tmp_path: Path) -> None:
    policies = service(tmp_path, maxPublishRatePerTopicInMessages="5")
    broker_rate = {"publishThrottlingRateInMsg": 5, "publishThrottlingRateInByte": 0}
    assert policies.effective(TOPIC, "publishRate") == broker_rate
    rate = {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": 1000}
    policies.update_namespace("public/default", {"publishRate": rate})
    record = policies.namespace("public/default") or {}
    assert record["publishMaxMessageRate"] == {"standalone": rate}
    assert policies.effective(TOPIC, "publishRate") == rate
    # No positive limit: unset, as Pulsar's normalize() makes it; the namespace's applies.
    policies.update_topic(TOPIC.full, {"publishRate": {"publishThrottlingRateInMsg": 0}})
    assert policies.effective(TOPIC, "publishRate") == rate
    policies.update_namespace("public/default", {"publishRate": None})
    assert "publishMaxMessageRate" not in (policies.namespace("public/default") or {})
    assert policies.effective(TOPIC, "publishRate") == broker_rate
