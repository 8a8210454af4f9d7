"""The standalone command line: config file, environment, unknown keys, clean shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client


def test_config_file_and_environment(tmp_path: Path, topic: str) -> None:
    broker = BrokerProcess(
        conf={
            "maxMessageSize": 2048,
            "allowAutoTopicCreation": "false",
            "noSuchKey": 1,
            "zookeeperServers": "zk:2181",
        },
        env={
            "PULSAR_PREFIX_brokerDeduplicationEnabled": "true",
            "PULSAR_PREFIX_alsoBogus": "x",
            "PULSAR_PREFIX_defaultNumPartitions": "4",
        },
    )
    try:
        broker.start()
        log = broker.log()
        assert "unknown configuration key 'noSuchKey'" in log
        assert "unknown configuration key 'alsoBogus'" in log
        # Known Pulsar keys that mean nothing here, or are parsed but not honoured, are named.
        assert "'zookeeperServers' is accepted but ignored: metadata is embedded" in log
        assert "'defaultNumPartitions' is accepted but ignored" in log
        client = make_client(broker.service_url)
        # allowAutoTopicCreation=false from the file: an unknown topic is not created.
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer(topic)
        status, _ = broker.admin("PUT", "/admin/v2/persistent/" + topic[13:])
        assert status == 204
        producer = client.create_producer(topic, batching_enabled=False)
        # maxMessageSize=2048 from the file is advertised to the client.
        with pytest.raises(pulsar.MessageTooBig):
            producer.send(b"x" * 4096)
        producer.send(b"small")
        status, stats = broker.admin("GET", "/admin/v2/persistent/" + topic[13:] + "/stats")
        # brokerDeduplicationEnabled from the environment.
        assert stats["deduplicationStatus"] == "Enabled"
        client.close()
    finally:
        broker.close()


def test_bad_config_value_is_reported(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("brokerServicePort=not-a-number\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keyshared.cli",
            "standalone",
            "--config",
            str(conf),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "brokerServicePort" in proc.stderr


def test_sigterm_shuts_down_cleanly_and_keeps_state(topic: str) -> None:
    broker = BrokerProcess()
    try:
        broker.start()
        client = make_client(broker.service_url)
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(6):
            producer.send(str(i).encode())
        for _ in range(6):
            m = consumer.receive(timeout_millis=5000)
            if int(m.data()) % 2 == 0:
                consumer.acknowledge(m)
        time.sleep(0.3)  # the client sends grouped acks every 100 ms
        client.close()
        assert broker.stop() == 0
        assert "keyshared: stopped" in broker.log()
        broker.start(same_ports=True)
        client = make_client(broker.service_url)
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        got = sorted(int(consumer.receive(timeout_millis=5000).data()) for _ in range(3))
        assert got == [1, 3, 5]
        client.close()
    finally:
        broker.close()


def test_ctrl_c_stops_the_broker(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keyshared.cli",
            "standalone",
            "--data-dir",
            str(tmp_path / "d"),
            "--broker-port",
            str(port),
            "--web-port",
            "0",
            "--bind-address",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "keyshared: stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
