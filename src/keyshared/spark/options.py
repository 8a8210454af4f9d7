"""The data source's options, parsed once from Spark's case-insensitive option map.

Reading (research/spark.md §5.2): ``service.url``, ``admin.url``, ``topic`` / ``topics`` /
``topicsPattern``, ``startingOffsets``, ``endingOffsets``, ``subscription``,
``maxRecordsPerBatch`` (alias ``maxOffsetsPerTrigger``), ``failOnDataLoss``, ``pollTimeoutMs``,
``minPartitions``, ``readCompacted``, ``predefinedSubscription``, ``subscriptionPrefix``,
``arrowBatchRows``, ``reader`` (``auto``/``native``/``client``), ``pulsar.client.*`` and
``pulsar.reader.*``.

Writing: ``service.url``, ``topic`` (else each row's ``__topic``), ``exactlyOnce``,
``producerName``, ``chunkRows``, ``pulsar.client.*`` and ``pulsar.producer.*``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")

# Spark lower-cases option keys; these are the client-kwarg spellings for the passthroughs.
_KNOWN_KWARGS = {
    "operationtimeoutseconds": "operation_timeout_seconds",
    "connectiontimeoutms": "connection_timeout_ms",
    "iothreads": "io_threads",
    "messagelistenerthreads": "message_listener_threads",
    "tlstrustcertsfilepath": "tls_trust_certs_file_path",
    "tlsallowinsecureconnection": "tls_allow_insecure_connection",
    "receiverqueuesize": "receiver_queue_size",
    "readername": "reader_name",
    "subscriptionroleprefix": "subscription_role_prefix",
    "sendtimeoutmillis": "send_timeout_millis",
    "maxpendingmessages": "max_pending_messages",
    "batchingmaxmessages": "batching_max_messages",
    "batchingmaxpublishdelayms": "batching_max_publish_delay_ms",
    "batchingmaxallowedsizeinbytes": "batching_max_allowed_size_in_bytes",
    "batchingenabled": "batching_enabled",
    "compressiontype": "compression_type",
}


class OptionError(ValueError):
    """An option is missing or malformed."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {key} must be true or false, not {raw!r}")


def _int(opts: Mapping[str, str], key: str, default: int | None) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise OptionError(f"option {key} must be an integer, not {raw!r}") from None


def _choice(opts: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = (opts.get(key.lower()) or choices[0]).strip().lower()
    if raw not in choices:
        raise OptionError(f"option {key} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def _value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(raw)
    except ValueError:
        return raw


def passthrough(opts: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """``pulsar.client.operationTimeoutSeconds=5`` to ``{"operation_timeout_seconds": 5}``."""
    out: dict[str, Any] = {}
    for key, raw in opts.items():
        key = key.lower()
        if key.startswith(prefix):
            name = key[len(prefix) :]
            out[_KNOWN_KWARGS.get(name, _CAMEL.sub("_", name).lower())] = _value(raw)
    return out


def parse_offsets_option(raw: str | None, default: str) -> str | dict[str, str]:
    """``earliest`` / ``latest`` or a JSON object ``{"<topic-partition>": "L:E", ...}``."""
    text = (raw or default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        obj = json.loads(text)
    except ValueError:
        raise OptionError(f"offsets must be earliest, latest or JSON, not {text!r}") from None
    if not isinstance(obj, dict):
        raise OptionError(f"offsets JSON must be an object, not {text!r}")
    return {str(k): str(v) for k, v in obj.items()}


@dataclass(frozen=True)
class SourceOptions:
    """Everything the reader needs, picklable (it travels to executors)."""

    service_url: str
    admin_url: str | None
    topics: tuple[str, ...]
    topics_pattern: str | None
    starting_offsets: str | dict[str, str]
    ending_offsets: str | dict[str, str]
    subscription: str | None
    max_records_per_batch: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    min_partitions: int
    read_compacted: bool
    predefined_subscription: str | None
    subscription_prefix: str | None
    arrow_batch_rows: int
    reader: str = "auto"
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    reader_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Validate Spark's options for a batch (``streaming=False``) or streaming read."""
        opts = _lower(options)
        url = opts.get("service.url")
        if not url:
            raise OptionError("option service.url is required (pulsar://host:6650)")
        given = [k for k in ("topic", "topics", "topicspattern") if opts.get(k)]
        if len(given) != 1:
            raise OptionError("exactly one of topic, topics, topicsPattern is required")
        topics: tuple[str, ...] = ()
        pattern = None
        if given[0] == "topicspattern":
            pattern = opts["topicspattern"]
            if not opts.get("admin.url"):
                raise OptionError("topicsPattern needs admin.url to list topics")
        else:
            topics = tuple(t.strip() for t in opts[given[0]].split(",") if t.strip())
        subscription = opts.get("subscription") or None
        if subscription and streaming:
            raise OptionError("subscription is for batch reads (a subscription's backlog)")
        if subscription and not opts.get("admin.url"):
            raise OptionError("subscription needs admin.url (it reads the cursor's state)")
        max_rows = _int(opts, "maxRecordsPerBatch", None)
        if max_rows is None:
            max_rows = _int(opts, "maxOffsetsPerTrigger", None)
        if max_rows is not None and max_rows <= 0:
            raise OptionError("maxRecordsPerBatch must be positive")
        ending = parse_offsets_option(opts.get("endingoffsets"), "latest")
        if ending == "earliest":
            raise OptionError("endingOffsets=earliest is not allowed")
        starting = parse_offsets_option(
            opts.get("startingoffsets"), "latest" if streaming else "earliest"
        )
        if subscription and "startingoffsets" in opts:
            raise OptionError("subscription and startingOffsets exclude each other")
        return cls(
            service_url=url,
            admin_url=opts.get("admin.url") or None,
            topics=topics,
            topics_pattern=pattern,
            starting_offsets=starting,
            ending_offsets=ending,
            subscription=subscription,
            max_records_per_batch=max_rows,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            poll_timeout_ms=_int(opts, "pollTimeoutMs", 120_000) or 120_000,
            min_partitions=_int(opts, "minPartitions", 0) or 0,
            read_compacted=_bool(opts, "readCompacted", False),
            predefined_subscription=opts.get("predefinedsubscription") or None,
            subscription_prefix=opts.get("subscriptionprefix") or None,
            arrow_batch_rows=_int(opts, "arrowBatchRows", 8192) or 8192,
            reader=_choice(opts, "reader", ("auto", "native", "client")),
            client_kwargs=passthrough(opts, "pulsar.client."),
            reader_kwargs=passthrough(opts, "pulsar.reader."),
        )


@dataclass(frozen=True)
class SinkOptions:
    """The writer's options, picklable."""

    service_url: str
    topic: str | None
    exactly_once: bool
    producer_name: str | None
    chunk_rows: int
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    producer_kwargs: dict[str, Any] = field(default_factory=dict)
    fail_after_rows: int | None = None
    fail_marker: str | None = None
    fail_from_batch: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate Spark's options for a write."""
        opts = _lower(options)
        url = opts.get("service.url")
        if not url:
            raise OptionError("option service.url is required (pulsar://host:6650)")
        exactly_once = _bool(opts, "exactlyOnce", False)
        name = opts.get("producername") or None
        if exactly_once and not name:
            raise OptionError(
                "exactlyOnce needs producerName: a name stable across restarts of this job"
            )
        chunk = _int(opts, "chunkRows", 10_000) or 10_000
        return cls(
            service_url=url,
            topic=opts.get("topic") or None,
            exactly_once=exactly_once,
            producer_name=name,
            chunk_rows=max(1, chunk),
            client_kwargs=passthrough(opts, "pulsar.client."),
            producer_kwargs=passthrough(opts, "pulsar.producer."),
            fail_after_rows=_int(opts, "testFailAfterRows", None),
            fail_marker=opts.get("testfailmarker") or None,
            fail_from_batch=_int(opts, "testFailFromBatch", 0) or 0,
        )
