"""Advertised listeners: a lookup answers the listener the client names, the internal one when it
names none, and refuses a listener the broker does not have (Pulsar's message)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from keyshared.protocol import commands, pb
from tests.broker_process import BrokerProcess, free_port, quiet_logger
from tests.raw_client import RawClient

pytestmark = pytest.mark.integration

T = pb.BaseCommand


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    port = free_port()
    proc = BrokerProcess(
        conf={
            "advertisedListeners": (
                f"internal:pulsar://127.0.0.1:{port},external:pulsar://localhost:{port}"
            ),
            "internalListenerName": "internal",
        }
    )
    proc.port = port
    try:
        yield proc.start(same_ports=True)
    finally:
        proc.close()


def lookup(broker: BrokerProcess, listener: str) -> pb.CommandLookupTopicResponse:
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        raw.send(
            commands.lookup(
                topic=f"persistent://public/default/l-{uuid.uuid4().hex[:6]}",
                request_id=1,
                advertised_listener_name=listener,
            )
        )
        return raw.expect(T.LOOKUP_RESPONSE).lookupTopicResponse


def test_lookup_answers_the_named_listener_or_the_internal_one(broker: BrokerProcess) -> None:
    assert lookup(broker, "external").brokerServiceUrl == f"pulsar://localhost:{broker.port}"
    assert lookup(broker, "").brokerServiceUrl == f"pulsar://127.0.0.1:{broker.port}"


def test_unknown_listener_is_refused(broker: BrokerProcess) -> None:
    resp = lookup(broker, "test")
    assert resp.response == pb.CommandLookupTopicResponse.Failed
    assert resp.error == pb.ServiceNotReady
    assert resp.message == "the broker do not have test listener"


def http_lookup(
    broker: BrokerProcess, query: str = "", header: str = ""
) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(
        f"{broker.web_url}/lookup/v2/topic/persistent/public/default/h-{uuid.uuid4().hex[:6]}"
        + query
    )
    if header:
        req.add_header("X-Pulsar-ListenerName", header)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read())


def test_http_lookup_answers_the_listener_named_by_query_or_header(broker: BrokerProcess) -> None:
    external, internal = f"pulsar://localhost:{broker.port}", f"pulsar://127.0.0.1:{broker.port}"
    assert http_lookup(broker)[1]["brokerUrl"] == internal
    assert http_lookup(broker, "?listenerName=external")[1]["brokerUrl"] == external
    assert http_lookup(broker, header="external")[1]["brokerUrl"] == external
    # The query parameter wins over the header, as in Pulsar's TopicLookup.
    assert http_lookup(broker, "?listenerName=internal", "external")[1]["brokerUrl"] == internal
    status, body = http_lookup(broker, "?listenerName=test")
    assert status >= 400 and "the broker do not have test listener" in json.dumps(body)


def test_official_client_with_a_listener_name(broker: BrokerProcess) -> None:
    topic = f"persistent://public/default/listener-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(broker.service_url, listener_name="external", logger=quiet_logger())
    try:
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"via external")
        assert consumer.receive(10_000).data() == b"via external"
    finally:
        client.close()
    client = pulsar.Client(
        broker.service_url, listener_name="test", logger=quiet_logger(), operation_timeout_seconds=5
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ("advertisedListeners=internal:http://x:1\n", "advertisedListeners"),
        ("advertisedListeners=a:pulsar://x:1,a:pulsar://y:2\n", "two pulsar URLs"),
        ("advertisedListeners=a:pulsar://x:1\ninternalListenerName=b\n", "internalListenerName"),
        ("advertisedListeners=a:pulsar://x:1\nadvertisedAddress=x\n", "must not appear together"),
    ],
)
def test_bad_listener_settings_stop_the_broker(tmp_path: Path, conf: str, named: str) -> None:
    conf_file = tmp_path / "broker.conf"
    conf_file.write_text(conf)
    proc = subprocess.run(
        [sys.executable, "-m", "keyshared.cli", "standalone", "--config", str(conf_file),
         "--data-dir", str(tmp_path / "d"), "--broker-port", "0", "--web-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
