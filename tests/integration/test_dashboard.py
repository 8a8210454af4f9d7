"""The dashboard in real headless Chromium, against a broker with a live Key_Shared subscription.

The page must show each consumer with exactly the hash ranges the admin stats give, mark the
draining hashes, answer a click on a draining hash with the messages that block it, follow the
broker live, and the test keeps a screenshot of it (``build/screenshots/dashboard.png``, or
``$KEYSHARED_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.chromium_cdp import Chromium, find_chromium
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("KEYSHARED_SCREENSHOT_DIR") or ROOT / "build" / "screenshots")
TOPIC = "persistent://public/default/orders"


@pytest.fixture
def browser() -> Iterator[Chromium]:
    """Headless Chromium (installed by `make deps-browser`; missing is a failure in CI)."""
    executable = find_chromium()
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: `make deps-browser` installs it")
        pytest.skip("chromium is not installed (`make deps-browser`)")
    b = Chromium(executable)
    yield b
    b.close()


def _sub_js(sub: str) -> str:
    """JS expression: the element of subscription ``sub`` of the topic."""
    return (
        f"document.querySelector('article.topic[data-topic={json.dumps(TOPIC)}] "
        f".sub[data-subscription={json.dumps(sub)}]')"
    )


def _until(what: str, probe: Any, want: Any, timeout: float = 15.0) -> Any:
    """Call ``probe`` until it returns ``want``; the last value otherwise (for the assert)."""
    deadline = time.monotonic() + timeout
    value = probe()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.1)
        value = probe()
    assert value == want, f"{what}: page shows {value!r}, broker says {want!r}"
    return value


def _ks_stats(broker: BrokerProcess) -> dict[str, Any]:
    status, stats = broker.admin("GET", "/admin/v2/persistent/public/default/orders/stats")
    assert status == 200, stats
    ks: dict[str, Any] = stats["subscriptions"]["ks"]
    return ks


def test_dashboard_shows_ranges_draining_hashes_and_what_blocks_a_hash(
    fresh_broker: BrokerProcess, browser: Chromium
) -> None:
    broker = fresh_broker.start()
    client = make_client(broker.service_url)
    try:

        def key_shared(name: str) -> pulsar.Consumer:
            return client.subscribe(
                TOPIC, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name
            )

        c1 = key_shared("worker-1")
        producer = client.create_producer(TOPIC, batching_enabled=False, producer_name="orders")
        for i in range(60):
            producer.send(f"order-{i}".encode(), partition_key=f"customer-{i % 20}")
        held = [c1.receive(timeout_millis=5000) for _ in range(60)]  # received, not acked
        c2, c3 = key_shared("worker-2"), key_shared("worker-3")
        audit = client.subscribe(
            TOPIC, "audit", consumer_type=pulsar.ConsumerType.Shared, consumer_name="auditor"
        )
        deadline = time.monotonic() + 10
        ks = _ks_stats(broker)
        while len(ks["consumers"]) < 3 or not ks["drainingHashesCount"]:
            assert time.monotonic() < deadline, ks
            time.sleep(0.05)
            ks = _ks_stats(broker)

        browser.goto(f"{broker.web_url}/?filter=orders")
        browser.wait_for("document.body.dataset.loaded === 'true'")
        sub = _sub_js("ks")

        # Each consumer's ranges, in its own colour, exactly as the admin stats give them.
        expected_ranges = sorted(
            [c["consumerName"], a, b] for c in ks["consumers"] for a, b in c["keyHashRangeArrays"]
        )
        _until(
            "hash ranges",
            lambda: sorted(
                browser.eval(
                    f"[...{sub}.querySelectorAll('rect.range')].map(r => "
                    "[r.dataset.consumer, +r.dataset.start, +r.dataset.end])"
                )
            ),
            expected_ranges,
        )
        colours = browser.eval(
            f"Object.fromEntries([...{sub}.querySelectorAll('rect.range')]"
            ".map(r => [r.dataset.consumer, r.getAttribute('fill')]))"
        )
        assert len(set(colours.values())) == 3, colours
        rows = browser.eval(
            f"[...{sub}.querySelectorAll('tr.consumer-row')].map(r => r.dataset.consumer)"
        )
        assert sorted(rows) == ["worker-1", "worker-2", "worker-3"]
        assert browser.eval(f"{sub}.querySelector('.badge.Key_Shared') !== null")

        # Draining hashes are marked (all held by worker-1, which has not acked).
        draining = sorted(
            d["hash"]
            for c in ks["consumers"]
            for d in c["drainingHashes"]
            if c["consumerName"] == "worker-1"
        )
        assert draining
        _until(
            "draining hashes",
            lambda: sorted(
                browser.eval(
                    f"[...{sub}.querySelectorAll('.draining-marker')].map(m => +m.dataset.hash)"
                )
            ),
            draining,
        )

        # A real click on a draining hash's marker shows the messages that block it.
        h = draining[len(draining) // 2]
        x, y = browser.eval(
            f'(() => {{ const r = {sub}.querySelector(\'.draining-marker[data-hash="{h}"] '
            "circle').getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        browser.click(x, y)
        status, blockers = broker.admin(
            "GET",
            f"/admin/v2/persistent/public/default/orders/subscription/ks/hashBlockers?hash={h}",
        )
        assert status == 200 and blockers["draining"] is True, blockers
        assert blockers["drainingConsumerName"] == "worker-1"
        panel = f"{sub}.querySelector('.blocker[data-testid=blocker][data-hash=\"{h}\"]')"
        shown = browser.wait_for(
            f"{panel} && [...{panel}.querySelectorAll('.msg-id')].map(e => e.textContent)"
        )
        assert set(blockers["unackedMessageIds"]) <= set(shown)
        assert "worker-1" in browser.eval(f"{panel}.textContent")
        assert browser.eval(f"{sub}.querySelector('.selected[data-hash=\"{h}\"]') !== null")

        # Topics, subscriptions, backlog and rates are on the page too.
        head = browser.eval(
            f"document.querySelector('article.topic[data-topic={json.dumps(TOPIC)}]').textContent"
        )
        assert "orders" in head and "msg/s" in head and "backlog" in head
        assert browser.eval(f"{_sub_js('audit')}.querySelector('.badge.Shared') !== null")

        shot = browser.screenshot(SCREENSHOTS / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        # Live: once worker-1 acks what it held, the page shows no draining hash, and the open
        # panel says the clicked hash is no longer blocked.
        for msg in held:
            c1.acknowledge(msg)
        _until(
            "draining after acks",
            lambda: browser.eval(f"{sub}.querySelectorAll('.draining-marker').length"),
            0,
        )
        browser.wait_for(f"{panel} && {panel}.dataset.draining === 'false'")
        for c in (c1, c2, c3, audit):
            c.close()
    finally:
        client.close()


def test_dashboard_marks_consumers_and_subscriptions_blocked_on_unacked(
    broker: BrokerProcess, browser: Chromium
) -> None:
    tag = f"unacked-{time.monotonic_ns() % 10**8}"
    per_consumer = f"persistent://public/default/{tag}-c"
    per_sub = f"persistent://public/default/{tag}-s"
    for topic, path, limit in (
        (per_consumer, "maxUnackedMessagesOnConsumer", 3),
        (per_sub, "maxUnackedMessagesOnSubscription", 4),
    ):
        rest = topic.removeprefix("persistent://")
        assert broker.admin("PUT", f"/admin/v2/persistent/{rest}")[0] == 204
        assert broker.admin("POST", f"/admin/v2/persistent/{rest}/{path}", limit)[0] == 204
    client = make_client(broker.service_url)
    try:
        shared = pulsar.ConsumerType.Shared
        slow = client.subscribe(per_consumer, "s", consumer_type=shared, consumer_name="slow")
        a = client.subscribe(per_sub, "s", consumer_type=shared, consumer_name="a")
        b = client.subscribe(per_sub, "s", consumer_type=shared, consumer_name="b")
        for topic in (per_consumer, per_sub):
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(10):
                producer.send(str(i).encode())
        browser.goto(f"{broker.web_url}/?filter={tag}")
        browser.wait_for("document.body.dataset.loaded === 'true'")

        def sub_of(topic: str) -> str:
            return (
                f"document.querySelector('article.topic[data-topic={json.dumps(topic)}] "
                '.sub[data-subscription="s"]\')'
            )

        blocked_rows = (
            f"[...{sub_of(per_consumer)}.querySelectorAll('tr.consumer-row')]"
            ".filter(r => r.querySelector('[data-testid=consumer-blocked-unacked]'))"
            ".map(r => r.dataset.consumer)"
        )
        _until("consumer blocked on unacked", lambda: browser.eval(blocked_rows), ["slow"])
        marked = f"{sub_of(per_sub)}.querySelector('[data-testid=sub-blocked-unacked]') !== null"
        _until("subscription blocked on unacked", lambda: browser.eval(marked), True)
        # Not marked where nothing is blocked: the per-consumer topic's subscription.
        other = f"{sub_of(per_consumer)}.querySelector('[data-testid=sub-blocked-unacked]')"
        assert browser.eval(f"{other} === null")
        for c in (slow, a, b):
            c.close()
    finally:
        client.close()


def test_dashboard_marks_a_topic_over_its_backlog_quota(
    fresh_broker: BrokerProcess, browser: Chromium
) -> None:
    fresh_broker.conf["backlogQuotaDefaultLimitBytes"] = 2000
    broker = fresh_broker.start()
    over, under = "persistent://public/default/over", "persistent://public/default/under"
    client = make_client(broker.service_url)
    try:
        for topic, size in ((over, 3000), (under, 10)):
            client.subscribe(topic, "slow").close()
            client.create_producer(topic).send(b"x" * size)
        browser.goto(f"{broker.web_url}/")
        browser.wait_for("document.body.dataset.loaded === 'true'")

        def badge(topic: str) -> str:
            return str(
                browser.eval(
                    f"(document.querySelector('article.topic[data-topic={json.dumps(topic)}] "
                    ".over-quota') || {textContent: ''}).textContent"
                )
            )

        _until("quota badge", lambda: badge(over), "over quota: size")
        assert badge(under) == ""
    finally:
        client.close()


def test_dashboard_shows_each_remote_clusters_replication(browser: Chromium) -> None:
    here = BrokerProcess(conf={"clusterName": "here"})
    there = BrokerProcess(conf={"clusterName": "there"})
    topic = "persistent://geo/ns/replicated"
    try:
        here.start()
        there.start()
        for b, name, other in ((here, "there", there), (there, "here", here)):
            body = {"serviceUrl": other.web_url, "brokerServiceUrl": other.service_url}
            for method, path, data in (
                ("PUT", f"/admin/v2/clusters/{name}", body),
                ("PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["here", "there"]}),
                ("PUT", "/admin/v2/namespaces/geo/ns", {}),
                ("POST", "/admin/v2/namespaces/geo/ns/replication", ["here", "there"]),
            ):
                status, answer = b.admin(method, path, data)
                assert status == 204, (path, status, answer)
        client = make_client(here.service_url)
        try:
            client.subscribe(topic, "audit").close()
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"first")
            browser.goto(f"{here.web_url}/")
            browser.wait_for("document.body.dataset.loaded === 'true'")
            rep = (
                f"document.querySelector('article.topic[data-topic={json.dumps(topic)}] "
                '.replication .r[data-cluster="there"]\')'
            )

            def shown() -> tuple[str, str, str]:
                got = browser.eval(
                    f"(() => {{ const r = {rep}; return r ? [r.className, "
                    "r.querySelector('.state').textContent, "
                    "(r.querySelector('.backlog') || {textContent: ''}).textContent] "
                    ": ['', '', '']; })()"
                )
                return (str(got[0]), str(got[1]), str(got[2]))

            _until("replicating", shown, ("r up", "connected", "0"))
            # The remote goes away: the page shows its replicator down and what waits for it.
            there.kill()
            for i in range(3):
                producer.send(f"m{i}".encode())
            _until("remote down", shown, ("r down", "disconnected", "3"), timeout=20)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            browser.screenshot(SCREENSHOTS / "dashboard-replication.png")
        finally:
            client.close()
    finally:
        here.close()
        there.close()
