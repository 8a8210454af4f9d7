"""subscriptionTypesEnabled: parsing, the topic > namespace > broker order, the refusal."""

from __future__ import annotations

import pytest

from keyshared.broker.consumer import SubType
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.sub_types import check_enabled, enabled_types, parse_types
from keyshared.config import BrokerConfig, ConfigError


def test_default_broker_setting_enables_every_type() -> None:
    assert enabled_types(None, None, BrokerConfig().subscriptionTypesEnabled) == {
        "Exclusive",
        "Shared",
        "Failover",
        "Key_Shared",
    }


def test_topic_over_namespace_over_broker_and_empty_is_unset() -> None:
    broker = "Exclusive, Shared"
    assert enabled_types(None, None, broker) == {"Exclusive", "Shared"}
    assert enabled_types(None, ["Key_Shared"], broker) == {"Key_Shared"}
    assert enabled_types(["Failover"], ["Key_Shared"], broker) == {"Failover"}
    assert enabled_types([], [], broker) == {"Exclusive", "Shared"}


def test_unknown_type_is_an_error_in_config_and_policies() -> None:
    with pytest.raises(ValueError, match="KeyShared"):
        parse_types(["KeyShared"])
    cfg = BrokerConfig()
    with pytest.raises(ConfigError, match="subscriptionTypesEnabled"):
        cfg.set("subscriptionTypesEnabled", "Exclusive,Sharde")
    assert cfg.set("subscriptionTypesEnabled", "Shared")
    assert cfg.subscriptionTypesEnabled == "Shared"


def test_refusal_is_pulsars_not_allowed_error() -> None:
    check_enabled("persistent://t/n/x", SubType.Shared, frozenset({"Shared"}))
    with pytest.raises(BrokerError) as info:
        check_enabled("persistent://t/n/x", SubType.Key_Shared, frozenset({"Shared"}))
    assert info.value.code == ServerError.NotAllowedError
    assert info.value.message == "Topic[{persistent://t/n/x}] doesn't support Key_Shared sub type!"
