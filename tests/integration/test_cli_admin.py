"""``keyshared admin ...`` and ``keyshared client ...`` as subprocesses against a real broker.

Every command is run at least once, the way a user runs it (``python -m keyshared.cli``), and
its effect is checked through the CLI itself or the REST API. Independent read-only commands
run concurrently to keep the suite fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import ok, tpath

pytestmark = pytest.mark.integration


def run(broker: BrokerProcess, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """``python -m keyshared.cli admin --admin-url URL ARGS``; checks the exit status."""
    cmd = [sys.executable, "-m", "keyshared.cli", "admin", "--admin-url", broker.web_url, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == expect, (args, done.returncode, done.stdout, done.stderr)
    return done


def client(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m keyshared.cli client --url URL ARGS``; must succeed."""
    cmd = [sys.executable, "-m", "keyshared.cli", "client", "--url", broker.service_url, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def out_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return done.stdout.split()


def parallel(broker: BrokerProcess, *commands: tuple[str, ...]) -> list[Any]:
    """Run independent commands at once; their outputs in order."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: run(broker, *c), commands))


def test_tenants_clusters_brokers(broker: BrokerProcess) -> None:
    tenant = f"cli-{uuid.uuid4().hex[:6]}"
    run(broker, "tenants", "create", tenant, "-r", "ops,dev")
    listed, info, clusters, health = parallel(
        broker,
        ("tenants", "list"),
        ("tenants", "get", tenant),
        ("clusters", "list"),
        ("brokers", "healthcheck"),
    )
    assert tenant in lines(listed)
    assert out_json(info) == {"adminRoles": ["dev", "ops"], "allowedClusters": ["standalone"]}
    assert lines(clusters) == ["standalone"]
    assert lines(health) == ["ok"]
    run(broker, "tenants", "update", tenant, "-r", "admin")
    assert out_json(run(broker, "tenants", "get", tenant))["adminRoles"] == ["admin"]
    dup = run(broker, "tenants", "create", tenant, expect=1)
    assert "Tenant already exists" in dup.stderr
    run(broker, "namespaces", "create", f"{tenant}/ns")
    assert "active namespaces" in run(broker, "tenants", "delete", tenant, expect=1).stderr
    run(broker, "tenants", "delete", tenant, "-f")
    assert tenant not in lines(run(broker, "tenants", "list"))


def test_clusters_create_get_update_delete(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker.start()
    run(
        b,
        "clusters",
        "create",
        "east",
        "--url",
        "http://east:8080",
        "--broker-url",
        "pulsar://east:6650",
    )
    local, east = parallel(b, ("clusters", "get", "standalone"), ("clusters", "get", "east"))
    assert out_json(local)["brokerServiceUrl"] == b.service_url
    assert out_json(east) == {
        "serviceUrl": "http://east:8080",
        "brokerServiceUrl": "pulsar://east:6650",
    }
    dup = run(b, "clusters", "create", "east", "--url", "http://east:8080", expect=1)
    assert "Cluster already exists" in dup.stderr
    run(b, "clusters", "update", "east", "--url", "http://east2:8080", "--auth-plugin", "p")
    assert out_json(run(b, "clusters", "get", "east")) == {
        "serviceUrl": "http://east2:8080",
        "authenticationPlugin": "p",
    }
    sni = ["--broker-url-secure", "pulsar+ssl://east:6651", "--proxy-url", "pulsar+ssl://p:4443"]
    refused = run(b, "clusters", "update", "east", *sni, expect=1)
    assert "proxyServiceUrl needs a proxyProtocol" in refused.stderr
    run(b, "clusters", "update", "east", *sni, "--proxy-protocol", "SNI")
    assert out_json(run(b, "clusters", "get", "east")) == {
        "brokerServiceUrlTls": "pulsar+ssl://east:6651",
        "proxyServiceUrl": "pulsar+ssl://p:4443",
        "proxyProtocol": "SNI",
    }
    assert lines(run(b, "clusters", "list")) == ["east", "standalone"]
    run(b, "clusters", "delete", "east")
    assert "Cluster does not exist" in run(b, "clusters", "get", "east", expect=1).stderr


def test_namespaces(broker: BrokerProcess) -> None:
    tenant = f"cli-{uuid.uuid4().hex[:6]}"
    ns = f"{tenant}/orders"
    run(broker, "tenants", "create", tenant)
    run(broker, "namespaces", "create", ns)
    parallel(
        broker,
        ("namespaces", "set-retention", ns, "--size", "10M", "--time", "3h"),
        ("namespaces", "set-deduplication", ns, "--enable"),
        ("namespaces", "set-message-ttl", ns, "-ttl", "1h"),
        ("namespaces", "set-dispatcher-pause-on-ack-state-persistent", ns),
        ("namespaces", "grant-permission", ns, "--role", "app", "--actions", "produce,consume"),
    )
    listed, retention, dedup, ttl, pause, perms, policies = parallel(
        broker,
        ("namespaces", "list", tenant),
        ("namespaces", "get-retention", ns),
        ("namespaces", "get-deduplication", ns),
        ("namespaces", "get-message-ttl", ns),
        ("namespaces", "get-dispatcher-pause-on-ack-state-persistent", ns),
        ("namespaces", "permissions", ns),
        ("namespaces", "policies", ns),
    )
    assert lines(listed) == [ns]
    assert out_json(retention) == {"retentionTimeInMinutes": 180, "retentionSizeInMB": 10}
    assert out_json(dedup) is True
    assert out_json(ttl) == 3600
    assert out_json(pause) is True
    assert out_json(perms) == {"app": ["consume", "produce"]}
    view = out_json(policies)
    assert view["deduplicationEnabled"] is True and view["message_ttl_in_seconds"] == 3600
    parallel(
        broker,
        ("namespaces", "remove-retention", ns),
        ("namespaces", "remove-deduplication", ns),
        ("namespaces", "remove-message-ttl", ns),
        ("namespaces", "remove-dispatcher-pause-on-ack-state-persistent", ns),
        ("namespaces", "revoke-permission", ns, "--role", "app"),
    )
    view = out_json(run(broker, "namespaces", "policies", ns))
    assert view["retention_policies"] is None and view["deduplicationEnabled"] is None
    assert view["message_ttl_in_seconds"] is None
    assert view["dispatcherPauseOnAckStatePersistentEnabled"] is None
    assert view["auth_policies"]["namespace_auth"] == {}
    assert (
        "invalid size"
        in run(
            broker, "namespaces", "set-retention", ns, "--size", "lots", "--time", "1h", expect=2
        ).stderr
    )
    # topics, clear-backlog, unload, delete
    run(broker, "topics", "create", f"persistent://{ns}/t")
    run(
        broker, "topics", "create-subscription", f"persistent://{ns}/t", "-s", "s", "-m", "earliest"
    )
    client(broker, "produce", f"persistent://{ns}/t", "-m", "a,b,c")
    assert lines(run(broker, "namespaces", "topics", ns)) == [f"persistent://{ns}/t"]
    backlog = ok(broker, "GET", tpath(f"persistent://{ns}/t", "stats"))
    assert backlog["subscriptions"]["s"]["msgBacklog"] == 3
    run(broker, "namespaces", "clear-backlog", ns, "-s", "s")
    run(broker, "namespaces", "clear-backlog", ns, "-force")
    stats = ok(broker, "GET", tpath(f"persistent://{ns}/t", "stats"))
    assert stats["subscriptions"]["s"]["msgBacklog"] == 0
    run(broker, "namespaces", "unload", ns)
    assert "non empty" in run(broker, "namespaces", "delete", ns, expect=1).stderr
    run(broker, "namespaces", "delete", ns, "--force")
    assert lines(run(broker, "namespaces", "list", tenant)) == []


def test_topics(broker: BrokerProcess) -> None:
    topic = f"persistent://public/default/cli-{uuid.uuid4().hex[:8]}"
    pt = topic + "-pt"
    run(broker, "topics", "create", topic)
    run(broker, "topics", "create-partitioned-topic", pt, "-p", "2")
    run(broker, "topics", "update-partitioned-topic", pt, "-p", "3")
    run(broker, "topics", "create-subscription", topic, "-s", "s", "-m", "earliest")
    run(broker, "topics", "create-subscription", pt, "-s", "s", "-m", "earliest")
    produced = client(
        broker, "produce", topic, "-m", "m0,m1,m2,m3", "-n", "1", "-k", "key-1", "-p", "a=b", "-db"
    )
    assert "4 messages successfully produced" in produced.stdout
    client(broker, "produce", pt, "-m", "x", "-n", "5")
    listed, partitioned, meta, stats, internal, pstats, subs, last = parallel(
        broker,
        ("topics", "list", "public/default"),
        ("topics", "list-partitioned-topics", "public/default"),
        ("topics", "get-partitioned-topic-metadata", pt),
        ("topics", "stats", topic),
        ("topics", "stats-internal", topic),
        ("topics", "partitioned-stats", pt, "--per-partition"),
        ("topics", "subscriptions", topic),
        ("topics", "last-message-id", topic),
    )
    assert topic in lines(listed) and f"{pt}-partition-2" in lines(listed)
    assert pt in lines(partitioned)
    assert out_json(meta) == {"partitions": 3}
    assert out_json(stats)["subscriptions"]["s"]["msgBacklog"] == 4
    assert out_json(internal)["numberOfEntries"] == 4
    assert out_json(pstats)["msgInCounter"] == 5 and len(out_json(pstats)["partitions"]) == 3
    assert lines(subs) == ["s"]
    last_id = out_json(last)
    ledger = last_id["ledgerId"]

    peek, examine, by_id, msg_id = parallel(
        broker,
        ("topics", "peek-messages", topic, "-s", "s", "-n", "2"),
        ("topics", "examine-message", topic, "-i", "earliest", "-m", "2"),
        ("topics", "get-message-by-id", topic, "-l", str(ledger), "-e", "3"),
        ("topics", "get-message-id", topic, "-d", "1h"),
    )
    peeked = out_json(peek)
    assert [m["payload"] for m in peeked] == ["m0", "m1"]
    assert peeked[0]["key"] == "key-1" and peeked[0]["properties"] == {"a": "b"}
    assert [m["payload"] for m in out_json(examine)] == ["m1"]
    assert [m["payload"] for m in out_json(by_id)] == ["m3"]
    assert out_json(msg_id)["ledgerId"] == ledger

    def backlog() -> int:
        return int(ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]["s"]["msgBacklog"])

    run(broker, "topics", "skip", topic, "-s", "s", "-n", "3")
    assert backlog() == 1
    run(broker, "topics", "reset-cursor", topic, "-s", "s", "-t", "1h")
    assert backlog() == 4
    run(broker, "topics", "clear-backlog", topic, "-s", "s")
    assert backlog() == 0
    run(broker, "topics", "reset-cursor", topic, "-s", "s", "-m", f"{ledger}:1")
    assert backlog() == 3
    run(broker, "topics", "reset-cursor", topic, "-s", "s", "-m", f"{ledger}:1", "-e")
    assert backlog() == 2
    assert "exactly one" in run(broker, "topics", "reset-cursor", topic, "-s", "s", expect=2).stderr

    # topic policies
    parallel(
        broker,
        ("topics", "set-deduplication", topic, "--disable"),
        ("topics", "set-retention", topic, "-s", "-1", "-t", "2d"),
        ("topics", "set-message-ttl", topic, "-t", "10m"),
    )
    dedup, retention, ttl, applied = parallel(
        broker,
        ("topics", "get-deduplication", topic),
        ("topics", "get-retention", topic),
        ("topics", "get-message-ttl", topic),
        ("topics", "get-message-ttl", topic, "--applied"),
    )
    assert out_json(dedup) is False
    assert out_json(retention) == {"retentionTimeInMinutes": 2880, "retentionSizeInMB": -1}
    assert out_json(ttl) == 600 and out_json(applied) == 600
    parallel(
        broker,
        ("topics", "remove-deduplication", topic),
        ("topics", "remove-retention", topic),
        ("topics", "remove-message-ttl", topic),
    )
    assert out_json(run(broker, "topics", "get-retention", topic)) is None

    # consume what is left, then unload, unsubscribe and delete
    consumed = client(
        broker, "consume", topic, "-s", "s", "-n", "2", "-t", "Shared", "--timeout", "10"
    )
    assert consumed.stdout.count("----- got message -----") == 2
    assert "content:m2" in consumed.stdout and "key:[key-1], properties:[a=b]" in consumed.stdout
    assert "2 messages successfully consumed" in consumed.stdout
    run(broker, "topics", "unload", topic)
    run(broker, "topics", "unsubscribe", topic, "-s", "s")
    assert lines(run(broker, "topics", "subscriptions", topic)) == []
    run(broker, "topics", "delete", topic)
    run(broker, "topics", "delete-partitioned-topic", pt, "-f")
    missing = run(broker, "topics", "stats", topic, expect=1)
    assert "Topic not found" in missing.stderr and "HTTP 404" in missing.stderr


def test_client_consume_key_shared_from_earliest(broker: BrokerProcess) -> None:
    topic = f"persistent://public/default/cli-{uuid.uuid4().hex[:8]}"
    run(broker, "topics", "create", topic)
    run(broker, "topics", "create-subscription", topic, "-s", "ks", "-m", "earliest")
    client(broker, "produce", topic, "-m", "hello", "-n", "3", "-k", "k")
    done = client(
        broker,
        "consume",
        topic,
        "-s",
        "ks",
        "-t",
        "Key_Shared",
        "-p",
        "Earliest",
        "-n",
        "3",
        "--hide-content",
        "--timeout",
        "10",
    )
    assert done.stdout.count("key:[k], properties:[]\n") == 3
    assert "content:" not in done.stdout


def test_global_options_and_errors(broker: BrokerProcess) -> None:
    # Token auth parameters are accepted in pulsar-admin's forms (this broker has no auth on).
    run(
        broker,
        "--auth-plugin",
        "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "--auth-params",
        "token:abc",
        "tenants",
        "list",
    )
    unreachable = subprocess.run(
        [
            sys.executable,
            "-m",
            "keyshared.cli",
            "admin",
            "--admin-url",
            "http://127.0.0.1:9",
            "tenants",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
    assert run(broker, "topics", "no-such-command", expect=2).returncode == 2
    assert "Missing command" in run(broker, expect=2).stderr
    assert "topics" in run(broker, "--help").stdout


def test_token_authentication(tmp_path: Path) -> None:
    """--auth-params carries a token (token:, file: and JSON forms) for admin and client."""
    secret = b"k" * 32
    key = tmp_path / "secret.key"
    key.write_bytes(secret)
    boss = jwt.encode({"sub": "boss"}, secret, algorithm="HS256")
    broker = BrokerProcess(
        conf={
            "authenticationEnabled": "true",
            "tokenSecretKey": f"file://{key}",
            "authorizationEnabled": "true",
            "superUserRoles": "boss",
            "brokerClientAuthenticationPlugin": "token",
            "brokerClientAuthenticationParameters": f"token:{boss}",
        }
    )
    try:
        broker.start()
        nobody = jwt.encode({"sub": "nobody"}, secret, algorithm="HS256")
        token_file = tmp_path / "boss.token"
        token_file.write_text(boss + "\n")
        for params in (f"token:{boss}", f"file://{token_file}", json.dumps({"token": boss})):
            assert "public" in lines(run(broker, "--auth-params", params, "tenants", "list"))
        assert "HTTP 401" in run(broker, "tenants", "list", expect=1).stderr
        denied = run(broker, "--auth-params", f"token:{nobody}", "tenants", "list", expect=1)
        assert "HTTP 403" in denied.stderr
        topic = f"persistent://public/default/auth-{uuid.uuid4().hex[:6]}"
        run(broker, "--auth-params", f"token:{boss}", "topics", "create", topic)
        run(
            broker,
            "--auth-params",
            f"token:{boss}",
            "topics",
            "create-subscription",
            topic,
            "-s",
            "s",
            "-m",
            "earliest",
        )
        auth = ["--auth-params", f"token:{boss}"]
        base = [sys.executable, "-m", "keyshared.cli", "client", "--url", broker.service_url]
        produced = subprocess.run(
            [*base, *auth, "produce", topic, "-m", "secret"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "1 messages successfully produced" in produced.stdout, produced.stderr
        consumed = subprocess.run(
            [*base, *auth, "consume", topic, "-s", "s", "--timeout", "10"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "content:secret" in consumed.stdout, consumed.stderr
    finally:
        broker.close()
