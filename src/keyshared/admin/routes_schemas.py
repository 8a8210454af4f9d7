"""Pulsar's ``SchemasResource`` (``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...``) and the
namespace schema policies (``schemaCompatibilityStrategy``, ``isAllowAutoUpdateSchema``,
``schemaValidationEnforced``) and the topic policy ``schemaCompatibilityStrategy``, over the
broker's schema registry (broker/schema/).

JSON as Pulsar's: ``GetSchemaResponse`` (version, type, timestamp, data, properties),
``GetAllVersionsSchemaResponse`` (getSchemaResponses), ``PostSchemaPayload`` (type, schema,
properties), ``PostSchemaResponse`` (version), ``DeleteSchemaResponse`` (version) and
``IsCompatibilityResponse`` (compatibility, schemaCompatibilityStrategy). An upload that breaks
the strategy is 409, as Pulsar answers an ``IncompatibleSchemaException``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker.errors import BrokerError
from keyshared.broker.schema import StoredSchema
from keyshared.broker.schema.compatibility import (
    STRATEGIES,
    TYPE_NAMES,
    Definition,
    IncompatibleSchemaError,
    check_compatible,
    type_name,
)
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName

_SCHEMA = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"


class PostSchemaPayload(BaseModel):
    """Pulsar's ``PostSchemaPayload``."""

    model_config = ConfigDict(extra="ignore")

    type: str
    schema_: str = ""
    properties: dict[str, str] | None = None

    def __init__(self, **data: Any) -> None:
        if "schema" in data:
            data["schema_"] = data.pop("schema")
        super().__init__(**data)


def _type_number(name: str) -> int:
    upper = name.upper()
    if upper in ("BYTES", "NONE"):
        return 0
    if upper in TYPE_NAMES:
        return TYPE_NAMES.index(upper)
    raise RestError(422, f"Invalid schema type {name}")


_KEY_VALUE = 15


def _json_or_text(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def schema_data_text(type_: int, data: bytes) -> str:
    """The ``data`` of a ``GetSchemaResponse``: the definition as text; for KEY_VALUE, whose
    wire form is the key's and the value's definitions each after a 4-byte big-endian length,
    the JSON ``{"key": ..., "value": ...}`` Pulsar's REST API (and the C++ client) use."""
    if type_ == _KEY_VALUE and len(data) >= 8:
        key_len = int.from_bytes(data[:4], "big")
        key = data[4 : 4 + key_len]
        rest = data[4 + key_len :]
        value_len = int.from_bytes(rest[:4], "big") if len(rest) >= 4 else 0
        if len(key) == key_len and len(rest) == 4 + value_len:
            value = rest[4:]
            return json.dumps({"key": _json_or_text(key), "value": _json_or_text(value)})
    return data.decode(errors="replace")


def schema_json(stored: StoredSchema) -> dict[str, Any]:
    """A version as Pulsar's ``GetSchemaResponse``."""
    return {
        "version": stored.version,
        "type": type_name(stored.type),
        "timestamp": stored.timestamp,
        "data": schema_data_text(stored.type, stored.data),
        "properties": stored.properties,
    }


def schema_routes(service: BrokerService) -> APIRouter:
    """The schema routes of ``service``."""
    router = APIRouter(tags=["schemas"])
    resolve = Resolver(service)
    registry = service.schemas
    store = service.policies

    def topic_of(tenant: str, namespace: str, topic: str) -> TopicName:
        return resolve.topic_name(tenant, namespace, topic)

    def payload(body: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
        if not isinstance(body, dict):
            raise RestError(400, "The body must be a PostSchemaPayload JSON object")
        try:
            p = PostSchemaPayload(**body)
        except ValueError:
            raise RestError(400, "Invalid PostSchemaPayload: needs type and schema") from None
        return _type_number(p.type), p.schema_.encode(), dict(p.properties or {})

    @router.get(_SCHEMA + "/schema")
    async def get_latest(tenant: str, namespace: str, topic: str) -> dict[str, Any]:
        """The latest version of the topic's schema (404 when it has none)."""
        stored = registry.get(topic_of(tenant, namespace, topic))
        if stored is None:
            raise RestError(404, "Schema not found")
        return schema_json(stored)

    @router.get(_SCHEMA + "/schema/{version}")
    async def get_version(tenant: str, namespace: str, topic: str, version: int) -> dict[str, Any]:
        """One version of the topic's schema."""
        stored = registry.get(topic_of(tenant, namespace, topic), version)
        if stored is None:
            raise RestError(404, "Schema not found")
        return schema_json(stored)

    @router.get(_SCHEMA + "/schemas")
    async def get_all(tenant: str, namespace: str, topic: str) -> dict[str, Any]:
        """Every version of the topic's schema, oldest first."""
        versions = registry.versions(topic_of(tenant, namespace, topic))
        if not versions:
            raise RestError(404, "Schema not found")
        return {"getSchemaResponses": [schema_json(s) for s in versions]}

    @router.post(_SCHEMA + "/schema")
    async def upload(
        tenant: str, namespace: str, topic: str, body: Annotated[Any, Body()]
    ) -> dict[str, Any]:
        """Add a version (or find the same one); 409 when the strategy refuses it."""
        name = topic_of(tenant, namespace, topic)
        type_, data, properties = payload(body)
        try:
            stored = registry.put(name, type_, data, properties)
        except BrokerError as exc:
            raise RestError(409, exc.message) from None
        return {"version": {"version": stored.version}}

    @router.delete(_SCHEMA + "/schema")
    async def delete(tenant: str, namespace: str, topic: str) -> dict[str, Any]:
        """Delete every version of the topic's schema."""
        version = registry.delete(topic_of(tenant, namespace, topic))
        if version is None:
            raise RestError(404, "Schema not found")
        return {"version": version}

    @router.post(_SCHEMA + "/compatibility")
    async def compatibility(
        tenant: str, namespace: str, topic: str, body: Annotated[Any, Body()]
    ) -> dict[str, Any]:
        """Whether the schema could be added under the strategy in force."""
        name = topic_of(tenant, namespace, topic)
        type_, data, _ = payload(body)
        strategy = registry.strategy(name)
        versions = registry.versions(name)
        compatible = True
        if not any(v.type == type_ and v.data == data for v in versions):
            try:
                check_compatible(
                    Definition(type_, data), [v.definition for v in versions], strategy
                )
            except IncompatibleSchemaError:
                compatible = False
        return {"compatibility": compatible, "schemaCompatibilityStrategy": strategy}

    # --- namespace policies ------------------------------------------------------------------
    @router.get(_NS + "/schemaCompatibilityStrategy")
    async def get_strategy(tenant: str, namespace: str) -> str:
        """The namespace's strategy (UNDEFINED when it sets none: the broker's applies)."""
        ns = resolve.namespace(tenant, namespace)
        return str(store.namespace_value(ns, "schemaCompatibilityStrategy") or "UNDEFINED")

    @router.put(_NS + "/schemaCompatibilityStrategy", status_code=204)
    async def set_strategy(tenant: str, namespace: str, value: Annotated[str, Body()]) -> Response:
        """Set the namespace's strategy (UNDEFINED removes it)."""
        ns = resolve.namespace(tenant, namespace)
        if value != "UNDEFINED" and value not in STRATEGIES:
            raise RestError(412, f"Invalid schema compatibility strategy {value}")
        store.update_namespace(
            ns, {"schemaCompatibilityStrategy": None if value == "UNDEFINED" else value}
        )
        return no_content()

    for policy in ("isAllowAutoUpdateSchema", "schemaValidationEnforced"):
        _flag_routes(router, resolve, store, policy)

    # --- topic policies ----------------------------------------------------------------------
    @router.get(_TOPIC + "/schemaCompatibilityStrategy")
    async def get_topic_strategy(tenant: str, namespace: str, topic: str) -> Any:
        """The topic's own strategy (null when it sets none)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        return store.topic_value(name.full, "schemaCompatibilityStrategy")

    @router.put(_TOPIC + "/schemaCompatibilityStrategy", status_code=204)
    async def set_topic_strategy(
        tenant: str, namespace: str, topic: str, value: Annotated[str, Body()]
    ) -> Response:
        """Set the topic's strategy."""
        name = resolve.policy_topic(tenant, namespace, topic)
        if value not in STRATEGIES:
            raise RestError(412, f"Invalid schema compatibility strategy {value}")
        store.update_topic(name.full, {"schemaCompatibilityStrategy": value})
        return no_content()

    @router.delete(_TOPIC + "/schemaCompatibilityStrategy", status_code=204)
    async def remove_topic_strategy(tenant: str, namespace: str, topic: str) -> Response:
        """Remove the topic's strategy (the namespace's or broker's applies)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {"schemaCompatibilityStrategy": None})
        return no_content()

    return router


def _flag_routes(router: APIRouter, resolve: Resolver, store: Any, policy: str) -> None:
    @router.get(_NS + "/" + policy, name=f"get_{policy}")
    async def get_flag(tenant: str, namespace: str) -> Any:
        """The namespace's value (the broker setting when it sets none)."""
        ns = resolve.namespace(tenant, namespace)
        return bool(store.namespace_effective(ns, policy))

    @router.post(_NS + "/" + policy, status_code=204, name=f"set_{policy}")
    async def set_flag(tenant: str, namespace: str, value: Annotated[bool, Body()]) -> Response:
        """Set the namespace's value."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {policy: value})
        return no_content()
