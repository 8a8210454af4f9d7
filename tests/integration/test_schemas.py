"""The schema registry through the official client: registration, versions, compatibility
refusals, decoding with the producer's schema, restarts and the admin REST API."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from keyshared.protocol import encode_command, pb
from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client
from tests.raw_client import RawClient


def _user(**fields: object) -> type[Record]:
    """A record named ``User`` (versions of one schema share the record name, as in Avro)."""
    return type("User", (Record,), dict(fields))


UserV1 = _user(name=String())
# A new field with a default: FULL-compatible with UserV1.
UserV2 = _user(name=String(), age=Integer(required_default=True))
# ``name`` gone and a required field without a default: incompatible both ways.
UserBad = _user(email=String(required=True))


def _rest_path(topic: str) -> str:
    return "/admin/v2/schemas/" + topic.removeprefix("persistent://")


def test_avro_versions_and_incompatible_producer(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    p1 = client.create_producer(topic, schema=AvroSchema(UserV1))
    consumer = client.subscribe(topic, "sub", schema=AvroSchema(UserV1))
    p1.send(UserV1(name="ada"))
    msg = consumer.receive(10000)
    assert msg.value().name == "ada"
    p2 = client.create_producer(topic, schema=AvroSchema(UserV2))
    p2.send(UserV2(name="bob", age=3))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserBad))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=StringSchema())
    status, versions = broker.admin("GET", _rest_path(topic) + "/schemas")
    assert status == 200, versions
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]
    status, latest = broker.admin("GET", _rest_path(topic) + "/schema")
    assert status == 200 and latest["version"] == 1 and latest["type"] == "AVRO"
    assert '"age"' in latest["data"]
    status, first = broker.admin("GET", _rest_path(topic) + "/schema/0")
    assert status == 200 and '"age"' not in first["data"]


def test_json_and_string_schemas(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, schema=JsonSchema(UserV1))
    consumer = client.subscribe(topic, "sub", schema=JsonSchema(UserV1))
    producer.send(UserV1(name="json"))
    assert consumer.receive(10000).value().name == "json"
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "other", schema=JsonSchema(UserBad))
    other = f"{topic}-s"
    sp = client.create_producer(other, schema=StringSchema())
    sc = client.subscribe(other, "sub", schema=StringSchema())
    sp.send("hello")
    assert sc.receive(10000).value() == "hello"


def test_versions_survive_a_restart(fresh_broker: BrokerProcess) -> None:
    broker = fresh_broker.start()
    topic = f"persistent://public/default/r-{uuid.uuid4().hex[:8]}"
    c = make_client(broker.service_url)
    c.create_producer(topic, schema=AvroSchema(UserV1)).close()
    c.create_producer(topic, schema=AvroSchema(UserV2)).close()
    c.close()
    broker.restart()
    c = make_client(broker.service_url)
    try:
        with pytest.raises(pulsar.IncompatibleSchema):
            c.create_producer(topic, schema=AvroSchema(UserBad))
        p = c.create_producer(topic, schema=AvroSchema(UserV2))
        p.send(UserV2(name="after", age=1))
        status, latest = broker.admin("GET", _rest_path(topic) + "/schema")
        assert status == 200 and latest["version"] == 1
    finally:
        c.close()


def test_always_incompatible_namespace_policy(broker: BrokerProcess, client: pulsar.Client) -> None:
    ns = f"public/ns-{uuid.uuid4().hex[:8]}"
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}")[0] in (200, 204)
    path = f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy"
    assert broker.admin("PUT", path, "ALWAYS_INCOMPATIBLE")[0] in (200, 204)
    assert broker.admin("GET", path) == (200, "ALWAYS_INCOMPATIBLE")
    topic = f"persistent://{ns}/t"
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserV2))
    # The same schema again is its existing version, not a new one.
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    assert broker.admin("PUT", path, "FULL")[0] in (200, 204)
    client.create_producer(topic, schema=AvroSchema(UserV2)).close()


def test_rest_upload_compatibility_delete(broker: BrokerProcess, topic: str) -> None:
    path = _rest_path(topic)
    assert broker.admin("GET", path + "/schema")[0] == 404
    v1 = AvroSchema(UserV1).schema_info().schema()
    v2 = AvroSchema(UserV2).schema_info().schema()
    bad = AvroSchema(UserBad).schema_info().schema()
    status, body = broker.admin("POST", path + "/schema", {"type": "AVRO", "schema": v1})
    assert (status, body) == (200, {"version": {"version": 0}})
    status, body = broker.admin("POST", path + "/compatibility", {"type": "AVRO", "schema": bad})
    assert status == 200 and body["compatibility"] is False
    assert body["schemaCompatibilityStrategy"] == "FULL"
    status, body = broker.admin("POST", path + "/compatibility", {"type": "AVRO", "schema": v2})
    assert status == 200 and body["compatibility"] is True
    status, body = broker.admin("POST", path + "/schema", {"type": "AVRO", "schema": bad})
    assert status == 409, body
    status, body = broker.admin("DELETE", path + "/schema")
    assert status == 200
    assert broker.admin("GET", path + "/schema")[0] == 404


def test_admin_cli_schemas(broker: BrokerProcess, topic: str, tmp_path: Path) -> None:
    from tests.integration.test_cli_admin import out_json, run

    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({"type": "AVRO", "schema": AvroSchema(UserV1).schema_info().schema()}))
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"type": "AVRO", "schema": AvroSchema(UserBad).schema_info().schema()})
    )
    run(broker, "schemas", "get", topic, expect=1)
    assert out_json(run(broker, "schemas", "upload", topic, "-f", str(v1))) == {
        "version": {"version": 0}
    }
    got = out_json(run(broker, "schemas", "get", topic))
    assert got["version"] == 0 and got["type"] == "AVRO"
    assert (
        out_json(run(broker, "schemas", "compatibility", topic, "-f", str(bad)))["compatibility"]
        is False
    )
    run(broker, "schemas", "upload", topic, "-f", str(bad), expect=1)
    assert [
        v["version"] for v in out_json(run(broker, "schemas", "get", topic, "--all-version"))
    ] == [0]
    run(broker, "schemas", "delete", topic)
    run(broker, "schemas", "get", topic, expect=1)
    ns = f"public/cli-{uuid.uuid4().hex[:8]}"
    run(broker, "namespaces", "create", ns)
    get = ("namespaces", "get-schema-compatibility-strategy", ns)
    assert run(broker, *get).stdout.strip() == "UNDEFINED"
    run(broker, "namespaces", "set-schema-compatibility-strategy", ns, "-c", "BACKWARD")
    assert run(broker, *get).stdout.strip() == "BACKWARD"
    run(broker, "namespaces", "set-schema-compatibility-strategy", ns, "-c", "SIDEWAYS", expect=1)
    flag = ("namespaces", "get-schema-validation-enforce", ns)
    assert out_json(run(broker, *flag)) is False
    run(broker, "namespaces", "set-schema-validation-enforce", ns, "--enable")
    assert out_json(run(broker, *flag)) is True
    run(broker, "namespaces", "set-is-allow-auto-update-schema", ns, "--disable")
    assert out_json(run(broker, "namespaces", "get-is-allow-auto-update-schema", ns)) is False


def test_dashboard_overview_shows_the_schema(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, schema=AvroSchema(UserV1))
    producer.send(UserV1(name="x"))
    status, body = broker.admin("GET", "/dashboard/api/overview")
    assert status == 200
    mine = [t for t in body["topics"] if t["name"] == topic]
    assert mine and mine[0]["schema"]["type"] == "AVRO" and mine[0]["schema"]["version"] == 0
    assert '"User"' in mine[0]["schema"]["data"]


def test_deleting_the_topic_deletes_its_schema(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    assert broker.admin("GET", _rest_path(topic) + "/schema")[0] == 200
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    assert broker.admin("DELETE", path)[0] == 204
    assert broker.admin("GET", _rest_path(topic) + "/schema")[0] == 404
    # A new topic of that name starts over with any schema.
    client.create_producer(topic, schema=AvroSchema(UserBad)).close()


def test_partitions_share_the_schema(broker: BrokerProcess, client: pulsar.Client) -> None:
    topic = f"persistent://public/default/p-{uuid.uuid4().hex[:8]}"
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/partitions"
    assert broker.admin("PUT", path, 3)[0] == 204
    producer = client.create_producer(topic, schema=AvroSchema(UserV1))
    producer.send(UserV1(name="p"))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic + "-partition-2", schema=AvroSchema(UserBad))
    status, body = broker.admin("GET", _rest_path(topic) + "/schema")
    assert status == 200 and body["version"] == 0


def test_validation_enforced_and_auto_update_policies(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    ns = f"public/ns-{uuid.uuid4().hex[:8]}"
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}")[0] == 204
    topic = f"persistent://{ns}/t"
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    # Not enforced (the default): a producer without a schema may publish.
    client.create_producer(topic).close()
    base = f"/admin/v2/namespaces/{ns}"
    assert broker.admin("POST", base + "/schemaValidationEnforced", True)[0] == 204
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic)
    assert broker.admin("POST", base + "/isAllowAutoUpdateSchema", False)[0] == 204
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserV2))
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    assert broker.admin("POST", base + "/isAllowAutoUpdateSchema", True)[0] == 204
    client.create_producer(topic, schema=AvroSchema(UserV2)).close()


def test_consumer_schema_registered_only_on_an_idle_topic(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    # An idle topic takes the first consumer's schema.
    client.subscribe(topic, "sub", schema=AvroSchema(UserV1)).close()
    assert broker.admin("GET", _rest_path(topic) + "/schema")[1]["version"] == 0
    # A topic with data and no schema accepts a consumer's schema without registering it.
    other = f"{topic}-busy"
    client.create_producer(other).send(b"raw bytes")
    client.subscribe(other, "sub", schema=AvroSchema(UserV1)).close()
    assert broker.admin("GET", _rest_path(other) + "/schema")[0] == 404


def test_topic_strategy_policy_overrides_the_namespace(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    path += "/schemaCompatibilityStrategy"
    assert broker.admin("GET", path) == (200, None)
    assert broker.admin("PUT", path, "NOT_A_STRATEGY")[0] == 412
    assert broker.admin("PUT", path, "ALWAYS_INCOMPATIBLE")[0] == 204
    assert broker.admin("GET", path) == (200, "ALWAYS_INCOMPATIBLE")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserV2))
    assert broker.admin("DELETE", path)[0] == 204
    client.create_producer(topic, schema=AvroSchema(UserV2)).close()


def _send(raw: RawClient, cmd: pb.BaseCommand) -> pb.BaseCommand:
    raw.send(encode_command(cmd))
    return raw.recv(timeout=10).command


def test_raw_schema_commands_and_bad_input(broker: BrokerProcess, topic: str) -> None:
    T = pb.BaseCommand
    avro = AvroSchema(UserV1).schema_info().schema().encode()
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        got = _send(
            raw,
            T(
                type=T.GET_OR_CREATE_SCHEMA,
                getOrCreateSchema=pb.CommandGetOrCreateSchema(
                    request_id=raw.request_id(),
                    topic=topic,
                    schema=pb.Schema(name="t", schema_data=avro, type=pb.Schema.Avro),
                ),
            ),
        )
        assert got.getOrCreateSchemaResponse.schema_version == b"\0" * 8
        got = _send(
            raw,
            T(
                type=T.GET_SCHEMA,
                getSchema=pb.CommandGetSchema(
                    request_id=raw.request_id(), topic=topic, schema_version=b"\0" * 8
                ),
            ),
        )
        r = got.getSchemaResponse
        assert not r.HasField("error_code") and bytes(r.schema.schema_data) == avro
        # A version that is not 8 bytes, or an unknown one: an error naming it, not a crash.
        got = _send(
            raw,
            T(
                type=T.GET_SCHEMA,
                getSchema=pb.CommandGetSchema(
                    request_id=raw.request_id(), topic=topic, schema_version=b"\1"
                ),
            ),
        )
        assert "Invalid schema version" in got.getSchemaResponse.error_message
        got = _send(
            raw,
            T(
                type=T.GET_SCHEMA,
                getSchema=pb.CommandGetSchema(
                    request_id=raw.request_id(), topic=topic, schema_version=b"\0" * 7 + b"\7"
                ),
            ),
        )
        assert got.getSchemaResponse.error_code == pb.TopicNotFound
        # An AVRO schema whose definition is not Avro is refused by name.
        got = _send(
            raw,
            T(
                type=T.GET_OR_CREATE_SCHEMA,
                getOrCreateSchema=pb.CommandGetOrCreateSchema(
                    request_id=raw.request_id(),
                    topic=f"{topic}-bad",
                    schema=pb.Schema(name="t", schema_data=b"{nope", type=pb.Schema.Avro),
                ),
            ),
        )
        resp = got.getOrCreateSchemaResponse
        assert resp.error_code == pb.IncompatibleSchema
        assert "Invalid schema definition" in resp.error_message
        raw.ping_pong()


def test_http_service_url_client_with_schema(broker: BrokerProcess, topic: str) -> None:
    # An http:// service URL: lookups (and schema fetches) go over the web port.
    c = make_client(broker.web_url)
    try:
        producer = c.create_producer(topic, schema=AvroSchema(UserV1))
        consumer = c.subscribe(topic, "sub", schema=AvroSchema(UserV1))
        producer.send(UserV1(name="over http"))
        assert consumer.receive(10000).value().name == "over http"
    finally:
        c.close()


def test_key_value_schema_data_as_pulsar_rest_shows_it() -> None:
    from keyshared.admin.routes_schemas import schema_data_text

    key, value = b'{"type":"string"}', b'{"type":"record","name":"V","fields":[]}'
    wire = len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value
    assert json.loads(schema_data_text(15, wire)) == {
        "key": {"type": "string"},
        "value": {"type": "record", "name": "V", "fields": []},
    }
    assert schema_data_text(15, b"\0\0") == "\0\0"
