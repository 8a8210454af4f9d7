"""Turning pulsar-admin style arguments into REST paths and values, and printing answers."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import typer

from keyshared.broker.topic_name import InvalidTopicName, TopicName

_SIZE = re.compile(r"^(-?\d+)([kKmMgGtT]?)$")
_TIME = re.compile(r"^(-?\d+)([smhdwyS]?)$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def seg(text: str) -> str:
    """One path segment, percent-encoded."""
    return quote(text, safe="")


def topic_path(topic: str, *rest: str) -> str:
    """``/admin/v2/persistent/t/ns/x/...`` for a full or short topic name."""
    try:
        name = TopicName.parse(topic)
    except InvalidTopicName as exc:
        raise typer.BadParameter(str(exc)) from None
    base = f"/admin/v2/{name.domain}/{seg(name.tenant)}/{seg(name.namespace)}"
    return "/".join([base, seg(name.local_name), *rest])


def namespace_path(namespace: str, *rest: str, prefix: str = "namespaces") -> str:
    """``/admin/v2/namespaces/t/ns/...`` for ``tenant/namespace``."""
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise typer.BadParameter(f"{namespace!r} is not tenant/namespace")
    return "/".join([f"/admin/v2/{prefix}", seg(parts[0]), seg(parts[1]), *rest])


def parse_size_bytes(text: str) -> int:
    """pulsar-admin's size: bytes with an optional k/M/G/T suffix, -1 for no limit."""
    m = _SIZE.match(text.strip())
    if not m:
        raise typer.BadParameter(f"invalid size {text!r} (e.g. 4096, 10M, 16G, -1)")
    value = int(m.group(1))
    if value == -1:
        return -1
    if value < 0:
        raise typer.BadParameter("size must be -1 or >= 0")
    return value * _SIZE_UNITS[m.group(2).lower()]


def parse_size_mb(text: str) -> int:
    """pulsar-admin's retention size (see :func:`parse_size_bytes`), in MB as
    ``RetentionPolicies`` wants it."""
    value = parse_size_bytes(text)
    return -1 if value == -1 else value // (1 << 20)


def parse_seconds(text: str) -> int:
    """pulsar-admin's relative time: seconds with an optional s/m/h/d/w/y suffix (-1 kept)."""
    m = _TIME.match(text.strip())
    if not m:
        raise typer.BadParameter(f"invalid time {text!r} (e.g. 100m, 3h, 2d, 5w, -1)")
    value = int(m.group(1))
    if value == -1:
        return -1
    if value < 0:
        raise typer.BadParameter("time must be -1 or >= 0")
    return value * _TIME_UNITS[m.group(2).lower()]


def retention_policies(size: str, time: str) -> dict[str, int]:
    """The ``RetentionPolicies`` body for pulsar-admin's ``--size`` and ``--time``."""
    seconds = parse_seconds(time)
    return {
        "retentionTimeInMinutes": -1 if seconds == -1 else seconds // 60,
        "retentionSizeInMB": parse_size_mb(size),
    }


def parse_reset_time(text: str, now_ms: int | None = None) -> int:
    """The timestamp (ms) ``reset-cursor -t`` means: a relative time back from now (``10m``),
    or an absolute ISO-8601 date-time."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if _TIME.match(text.strip()):
        return now - parse_seconds(text) * 1000
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"invalid time {text!r} (e.g. 10m, 2h, 2024-05-01T10:00:00Z)"
        ) from None
    return int(stamp.timestamp() * 1000)


def parse_message_id(text: str) -> dict[str, int]:
    """``ledgerId:entryId`` (or ``earliest`` / ``latest``) as a ``MessageIdImpl`` body."""
    low = text.strip().lower()
    if low == "earliest":
        return {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    if low == "latest":
        return {"ledgerId": 2**63 - 1, "entryId": 2**63 - 1, "partitionIndex": -1}
    parts = low.split(":")
    try:
        ledger, entry = int(parts[0]), int(parts[1])
        partition = int(parts[2]) if len(parts) > 2 else -1
    except (ValueError, IndexError):
        raise typer.BadParameter(
            f"invalid message id {text!r} (expected ledgerId:entryId)"
        ) from None
    return {"ledgerId": ledger, "entryId": entry, "partitionIndex": partition}


def print_json(value: Any) -> None:
    """Pretty JSON, as pulsar-admin prints stats and policies."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def print_lines(values: list[Any]) -> None:
    """One item per line, as pulsar-admin prints lists."""
    for value in values:
        sys.stdout.write(f"{value}\n")
