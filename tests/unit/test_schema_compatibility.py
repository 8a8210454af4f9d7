"""Pulsar's schema compatibility strategies on Avro record evolutions, table-driven, and the
registry's versioning over a real (in-memory) metadata store."""

from __future__ import annotations

import json

import pytest

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.policies import PolicyService
from keyshared.broker.schema import SchemaRegistry, version_bytes
from keyshared.broker.schema.compatibility import (
    Definition,
    IncompatibleSchemaError,
    check_compatible,
)
from keyshared.broker.topic_name import TopicName
from keyshared.config import BrokerConfig
from keyshared.storage.metadata import MetadataStore

AVRO, JSON_TYPE, STRING = 4, 2, 1


def _record(*fields: dict[str, object]) -> bytes:
    return json.dumps({"type": "record", "name": "User", "fields": list(fields)}).encode()


NAME = {"name": "name", "type": "string"}
AGE_DEFAULT = {"name": "age", "type": "int", "default": 0}
AGE = {"name": "age", "type": "int"}
NAME_DEFAULT = {"name": "name", "type": "string", "default": ""}
NAME_LONG = {"name": "name", "type": "long"}
ID = {"name": "id", "type": "int"}
ID_AS_LONG = {"name": "id", "type": "long"}
RENAMED = {"name": "fullName", "type": "string"}

# evolution -> (old, new, backward ok, forward ok). BACKWARD: new reads old data;
# FORWARD: old reads new data.
EVOLUTIONS: dict[str, tuple[bytes, bytes, bool, bool]] = {
    "add field with default": (_record(NAME), _record(NAME, AGE_DEFAULT), True, True),
    "add field without default": (_record(NAME), _record(NAME, AGE), False, True),
    "remove field with default": (_record(NAME_DEFAULT, AGE), _record(AGE), True, True),
    "remove field without default": (_record(NAME, AGE), _record(AGE), True, False),
    "change type string to long": (_record(NAME), _record(NAME_LONG), False, False),
    "promote int to long": (_record(ID), _record(ID_AS_LONG), True, False),
    "rename field": (_record(NAME), _record(RENAMED), False, False),
}
EXPECTED = {
    "ALWAYS_COMPATIBLE": lambda b, f: True,
    "ALWAYS_INCOMPATIBLE": lambda b, f: False,
    "BACKWARD": lambda b, f: b,
    "FORWARD": lambda b, f: f,
    "FULL": lambda b, f: b and f,
    "BACKWARD_TRANSITIVE": lambda b, f: b,
    "FORWARD_TRANSITIVE": lambda b, f: f,
    "FULL_TRANSITIVE": lambda b, f: b and f,
}


def _compatible(new: bytes, existing: list[bytes], strategy: str, type_: int = AVRO) -> bool:
    try:
        check_compatible(Definition(type_, new), [Definition(type_, d) for d in existing], strategy)
    except IncompatibleSchemaError:
        return False
    return True


@pytest.mark.parametrize("strategy", sorted(EXPECTED))
@pytest.mark.parametrize("evolution", sorted(EVOLUTIONS))
@pytest.mark.parametrize("type_", [AVRO, JSON_TYPE])
def test_strategy_on_evolution(strategy: str, evolution: str, type_: int) -> None:
    old, new, backward, forward = EVOLUTIONS[evolution]
    assert _compatible(new, [old], strategy, type_) is EXPECTED[strategy](backward, forward)


@pytest.mark.parametrize(
    ("strategy", "transitive_ok"),
    [
        ("BACKWARD", True),
        ("BACKWARD_TRANSITIVE", False),
        ("FULL", True),
        ("FULL_TRANSITIVE", False),
    ],
)
def test_transitive_checks_every_version(strategy: str, transitive_ok: bool) -> None:
    # v0 has no age; v1 adds it with a default; v2 drops the default. v2 reads v1's data (age is
    # always written) but not v0's: only the transitive forms look back at v0. Forward, v0 and
    # v1 both read v2's data, so FULL splits the same way.
    v0, v1 = _record(NAME), _record(NAME, AGE_DEFAULT)
    v2 = _record(NAME, AGE)
    assert _compatible(v2, [v0, v1], strategy) is transitive_ok


def test_other_types_same_type_only() -> None:
    assert _compatible(b"", [b""], "FULL", STRING)
    with pytest.raises(IncompatibleSchemaError, match="exists schema type AVRO, new schema type"):
        check_compatible(Definition(STRING, b""), [Definition(AVRO, _record(NAME))], "FULL")
    assert _compatible(b"", [_record(NAME)], "ALWAYS_COMPATIBLE", STRING)


def test_invalid_definition_is_named() -> None:
    with pytest.raises(IncompatibleSchemaError, match="Invalid schema definition"):
        check_compatible(Definition(AVRO, b"{not json"), [], "FULL")


def _registry(**conf: str) -> SchemaRegistry:
    config = BrokerConfig()
    config.update(conf)
    store = MetadataStore(":memory:")
    return SchemaRegistry(store, PolicyService(store, config))


def test_registry_versions_partitions_and_delete() -> None:
    reg = _registry()
    base = TopicName.parse("persistent://public/default/t")
    v0 = reg.for_producer(base.partition(0), (AVRO, _record(NAME), {}))
    assert v0 is not None and v0.version == 0
    # Every partition shares the partitioned topic's schema.
    same = reg.for_producer(base.partition(3), (AVRO, _record(NAME), {"k": "v"}))
    assert same is not None and same.version == 0
    v1 = reg.for_producer(base, (AVRO, _record(NAME, AGE_DEFAULT), {}))
    assert v1 is not None and v1.version == 1 and version_bytes(1) == b"\0" * 7 + b"\1"
    with pytest.raises(BrokerError) as err:
        reg.for_producer(base, (AVRO, _record(RENAMED), {}))
    assert err.value.code is ServerError.IncompatibleSchema
    with pytest.raises(BrokerError, match="Trying to subscribe with incompatible schema"):
        reg.for_consumer(base, (AVRO, _record(RENAMED), {}))
    assert reg.for_producer(base, None) is None
    assert reg.delete(base) == 1
    assert reg.get(base) is None
    again = reg.for_producer(base, (AVRO, _record(RENAMED), {}))
    assert again is not None and again.version == 2


def test_registry_auto_update_off_and_validation_enforced() -> None:
    reg = _registry(isAllowAutoUpdateSchema="false", isSchemaValidationEnforced="true")
    topic = TopicName.parse("persistent://public/default/t")
    assert reg.for_producer(topic, None) is None
    reg.for_producer(topic, (AVRO, _record(NAME), {}))
    with pytest.raises(BrokerError, match="auto updating is disabled"):
        reg.for_producer(topic, (AVRO, _record(NAME, AGE_DEFAULT), {}))
    with pytest.raises(BrokerError, match="without a schema"):
        reg.for_producer(topic, None)
