"""broker.conf keys keyshared accepts but ignores are reported by name, with the reason."""

from __future__ import annotations

import dataclasses

from keyshared.config import NO_OP_KEYS, BrokerConfig, no_op_reason


def test_known_pulsar_keys_are_reported_with_their_reason() -> None:
    cfg = BrokerConfig()
    cfg.update(
        {
            "zookeeperServers": "zk:2181",
            "bookkeeperClientTimeoutInSeconds": "30",
            "loadBalancerEnabled": "true",
            "defaultNumPartitions": "3",
            "noSuchKey": "1",
            "brokerDeduplicationEnabled": "true",
        }
    )
    assert cfg.unknown_keys == ["noSuchKey"]
    assert cfg.ignored_keys == [
        "zookeeperServers",
        "bookkeeperClientTimeoutInSeconds",
        "loadBalancerEnabled",
        "defaultNumPartitions",
    ]
    warnings = cfg.warnings()
    assert warnings[0] == "unknown configuration key 'noSuchKey' (ignored)"
    assert any("'bookkeeperClientTimeoutInSeconds'" in w and "BookKeeper" in w for w in warnings)
    assert len(warnings) == 5
    # A key the broker honours is neither.
    assert cfg.brokerDeduplicationEnabled is True
    assert "ignored_keys" not in cfg.to_dict() and "unknown_keys" not in cfg.to_dict()


def test_untouched_no_op_keys_are_not_reported() -> None:
    assert BrokerConfig().warnings() == []


def test_every_no_op_has_a_reason_and_no_honoured_key_is_one() -> None:
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    for key, reason in NO_OP_KEYS.items():
        assert reason and no_op_reason(key) == reason
    for honoured in ("clusterName", "brokerDeduplicationEnabled", "subscriptionTypesEnabled"):
        assert honoured in fields and no_op_reason(honoured) is None
