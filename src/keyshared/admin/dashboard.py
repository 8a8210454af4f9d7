"""The live dashboard at the web port's root: a static page and the one JSON snapshot it polls.

The page (``admin/assets``: plain HTML, CSS and JavaScript, no build step, nothing from another
host) polls ``GET /dashboard/api/overview`` about once a second and draws topics, subscriptions,
consumers, backlog and rates; for each Key_Shared subscription, the hash space with each
consumer's ranges and the draining hashes; a topic over its backlog quota; a topic's latest
schema (type and version, the definition on hover); a replicated topic's remote clusters, each
with its replicator's state (connected, backlog, delay, rates; the last error on hover). A click on a hash asks the admin API's
``.../subscription/{sub}/hashBlockers?hash=H`` what blocks it.

The snapshot is the admin stats (same field names) of every loaded topic, with what the stats
lack for a picture: each consumer's id and each Key_Shared subscription's hash range. When
authentication is on, the page and its assets are public; the snapshot needs a super user, and
the page asks for a token and sends it as ``Authorization: Bearer``.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from keyshared import __version__
from keyshared.broker.schema.compatibility import type_name
from keyshared.broker.service import BrokerService

OVERVIEW_PATH = "/dashboard/api/overview"

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The files of ``admin/assets`` by name, with their content types (read once, at start)."""
    folder = resources.files("keyshared.admin").joinpath("assets")
    out: dict[str, tuple[bytes, str]] = {}
    for item in folder.iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1] if "." in item.name else ""
        if item.is_file() and suffix in _CONTENT_TYPES:
            out[item.name] = (item.read_bytes(), _CONTENT_TYPES[suffix])
    return out


def overview(service: BrokerService) -> dict[str, Any]:
    """Every loaded topic's stats, subscriptions as a list, plus consumer ids and hash ranges."""
    topics: list[dict[str, Any]] = []
    for topic in sorted(service.topics.values(), key=lambda t: t.name.full):
        if topic.closed:
            continue
        st = topic.stats()
        subs: list[dict[str, Any]] = []
        for name, sub in sorted(st.pop("subscriptions").items()):
            live = topic.subscriptions.get(name)
            objects = live.consumers if live is not None else []
            for obj, consumer in zip(objects, sub["consumers"], strict=False):
                consumer["consumerId"] = obj.consumer_id
            selector = getattr(live.dispatcher, "selector", None) if live is not None else None
            key_range = getattr(selector, "key_hash_range", None)
            if key_range is not None:
                sub["hashRange"] = [int(key_range[0]), int(key_range[1])]
            sub["name"] = name
            subs.append(sub)
        held = service.rate_limits.throttled_connections(topic.name)
        for live_producer, producer in zip(
            topic.producers.values(), st["publishers"], strict=False
        ):
            # Its connection is not read now: a publish rate limit holds it.
            producer["rateLimited"] = id(live_producer.transport) in held
        # Which clusters this topic replicates to (stats also list clusters that only
        # replicate here), and why a replicator is not connected.
        replicators = topic.replication.replicators
        st["replicationOutbound"] = sorted(replicators)
        st["replicationErrors"] = {
            c: r.last_error for c, r in sorted(replicators.items()) if r.last_error
        }
        st["name"] = topic.name.full
        st["namespace"] = topic.name.namespace_name
        st["subscriptions"] = subs
        st["msgBacklog"] = sum(s["msgBacklog"] for s in subs)
        # The quota types exceeded now (the page marks the topic).
        st["backlogQuotaExceeded"] = topic.backlog_quota.exceeded()
        schema = service.schemas.get(topic.name)
        st["schema"] = (
            None
            if schema is None
            else {
                "version": schema.version,
                "type": type_name(schema.type),
                "data": schema.data.decode(errors="replace"),
            }
        )
        topics.append(st)
    return {
        "cluster": service.config.clusterName,
        "version": __version__,
        "timestamp": int(time.time() * 1000),
        "topics": topics,
    }


def add_dashboard_routes(app: FastAPI, service: BrokerService) -> None:
    """Serve the page at ``/``, its files under ``/assets/`` and the snapshot it polls."""
    assets = load_assets()
    page, page_type = assets["index.html"]

    async def index() -> Response:
        return Response(page, media_type=page_type, headers={"Cache-Control": "no-cache"})

    async def asset(name: str) -> Response:
        found = assets.get(name)
        if found is None:
            return Response(b"not found", status_code=404, media_type="text/plain")
        body, content_type = found
        return Response(body, media_type=content_type, headers={"Cache-Control": "no-cache"})

    # async: stats are read on the broker's event loop, never from a worker thread.
    async def snapshot() -> dict[str, Any]:
        return overview(service)

    for path in ("/", "/index.html"):
        app.add_api_route(path, index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/assets/{name}", asset, methods=["GET"], include_in_schema=False)
    app.add_api_route(OVERVIEW_PATH, snapshot, methods=["GET"], include_in_schema=False)
