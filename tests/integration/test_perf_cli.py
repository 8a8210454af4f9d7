"""``keyshared perf produce | consume`` against a real broker, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


def perf(*args: str, timeout: float = 40) -> subprocess.CompletedProcess[str]:
    """Run ``keyshared perf ARGS`` in its own process (stdout is not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "keyshared.cli", "perf", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load(path: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(path.read_text())
    return summary


def check_latency(lat: dict[str, float]) -> None:
    order = ["min", "p50", "p75", "p90", "p95", "p99", "p99.9", "p99.99", "max"]
    values = [lat[k] for k in order]
    assert values == sorted(values), lat
    assert lat["min"] <= lat["mean"] <= lat["max"]
    assert lat["max"] > 0


def test_produce_then_consume_key_shared(broker: BrokerProcess, topic: str, tmp_path: Path) -> None:
    produced = tmp_path / "produce.json"
    run = perf(
        "produce",
        "-u",
        broker.service_url,
        "-r",
        "1000",
        "-m",
        "600",
        "-s",
        "200",
        "-mk",
        "autoIncrement",
        "-nk",
        "40",
        "-i",
        "0.2",
        "--json-out",
        str(produced),
        topic,
    )
    assert run.returncode == 0, run.stderr
    # The live line: rate and latency percentiles, every interval.
    lines = [line for line in run.stderr.splitlines() if line.startswith("produce ")]
    assert len(lines) >= 2, run.stderr
    assert "msg/s" in lines[-1] and "p99" in lines[-1] and "p99.9" in lines[-1]
    p = load(produced)
    assert p["command"] == "produce" and p["topics"] == [topic]
    assert p["messages"] == p["sent"] == 600 and p["failed"] == 0
    assert p["bytes"] == 600 * 200
    assert p["latencyKind"] == "publish"
    check_latency(p["latencyMs"])
    # -r 1000: 600 messages cannot go out in much less than 0.6 s.
    assert p["durationSeconds"] >= 0.55 and p["msgPerSec"] <= 1100
    assert p["config"]["batching"]["enabled"] is True and p["config"]["size"] == 200
    assert p["intervals"] and all("msgPerSec" in iv for iv in p["intervals"])
    status, stats = broker.admin(
        "GET", "/admin/v2/persistent/" + topic[len("persistent://") :] + "/stats"
    )
    assert status == 200 and stats["msgInCounter"] == 600

    consumed = tmp_path / "consume.json"
    run = perf(
        "consume",
        "-u",
        broker.service_url,
        "-st",
        "Key_Shared",
        "-s",
        "perf-ks",
        "-n",
        "2",
        "-sp",
        "Earliest",
        "-m",
        "600",
        "-i",
        "0.2",
        "--json-out",
        str(consumed),
        topic,
    )
    assert run.returncode == 0, run.stderr
    c = load(consumed)
    assert c["command"] == "consume" and c["messages"] == 600 and c["bytes"] == 600 * 200
    assert c["latencyKind"] == "end-to-end"
    check_latency(c["latencyMs"])
    assert c["config"]["subscriptionType"] == "Key_Shared"
    assert c["config"]["numConsumers"] == 2
    assert "consume " in run.stderr and "end-to-end latency" in run.stderr
    # Everything was acknowledged: the subscription has no backlog left.
    deadline = time.monotonic() + 10
    while True:
        status, stats = broker.admin(
            "GET", "/admin/v2/persistent/" + topic[len("persistent://") :] + "/stats"
        )
        if stats["subscriptions"]["perf-ks"]["msgBacklog"] == 0:
            break
        assert time.monotonic() < deadline, stats["subscriptions"]["perf-ks"]
        time.sleep(0.1)


def test_duration_unbatched_and_json_to_stdout(broker: BrokerProcess, topic: str) -> None:
    run = perf(
        "produce",
        "-u",
        broker.service_url,
        "-r",
        "300",
        "-time",
        "1",
        "-db",
        "-s",
        "64",
        "-z",
        "lz4",
        "--json-out",
        "-",
        topic,
    )
    assert run.returncode == 0, run.stderr
    p = json.loads(run.stdout)
    assert p["config"]["batching"]["enabled"] is False and p["config"]["compression"] == "LZ4"
    assert 0.9 <= p["durationSeconds"] < 5
    assert 200 <= p["messages"] <= 330 and p["failed"] == 0


def test_bad_arguments_and_help() -> None:
    run = perf("produce", "--bogus", "persistent://public/default/x")
    assert run.returncode == 2 and "unrecognized arguments" in run.stderr
    run = perf("consume", "-st", "Nope", "persistent://public/default/x")
    assert run.returncode == 2 and "invalid choice" in run.stderr
    help_text = perf("produce", "--help").stdout
    for option in ("--rate", "--size", "--num-messages", "--test-duration", "-bm", "-db"):
        assert option in help_text
