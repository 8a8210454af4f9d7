"""subscriptionTypesEnabled: parsing and the refusal (the resolution: test_policies)."""

from __future__ import annotations

import pytest

from keyshared.broker.consumer import SubType
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.sub_types import check_enabled, parse_types
from keyshared.config import BrokerConfig, ConfigError


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
