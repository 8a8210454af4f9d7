"""The replicator's pure decisions: names, what to forward, how to forward it, when to retry.

Synchronous and free of I/O, so unit tests (and a simulator) can drive them. Pulsar's rules
(``PersistentReplicator``, ``MessageDeduplication``, ``AbstractReplicator``):

* the replicator of a topic towards cluster ``remote`` reads with the durable cursor
  ``pulsar.repl.{remote}`` and publishes on the remote as ``pulsar.repl.{local}-->{remote}``
  (``replicatorPrefix`` + ``.`` + local cluster, the delimiter ``-->``, the remote cluster);
* an entry is not forwarded when it was itself replicated here (``replicated_from`` set: no
  loops, however many clusters), or when the producer restricted it with ``replicate_to``
  (``disable_replication`` is ``replicate_to=["__local__"]``) and the list leaves ``remote`` out;
* an entry is forwarded whole (batches are not re-batched, compressed payloads stay compressed)
  with its metadata unchanged but for ``replicated_from`` = the local cluster;
* the remote deduplicates a replicator's sends by the *original* producer name and sequence id
  found in the metadata, not by the replicator's own producer name;
* failures are retried with Pulsar's back-off: 100 ms doubling up to one minute.
"""

from __future__ import annotations

from collections.abc import Iterable

from keyshared.protocol import ProtocolError, encode_payload_section, pb, split_payload

REPLICATOR_PREFIX = "pulsar.repl"
"""Pulsar's ``replicatorPrefix``: the replicator's cursor and producer names start with it."""
PRODUCER_NAME_DELIMITER = "-->"
"""Between the local and the remote cluster in the replicator's producer name."""
LOCAL_ONLY = "__local__"
"""What the clients put in ``replicate_to`` for ``disable_replication``."""

__all__ = [
    "LOCAL_ONLY",
    "PRODUCER_NAME_DELIMITER",
    "REPLICATOR_PREFIX",
    "Backoff",
    "dedup_producer_name",
    "forward_section",
    "inbound_cluster",
    "is_replicator_producer",
    "remote_clusters",
    "replicator_cursor_name",
    "replicator_producer_name",
    "should_forward",
]


def replicator_cursor_name(remote: str, prefix: str = REPLICATOR_PREFIX) -> str:
    """The durable cursor a topic's replicator towards ``remote`` reads with."""
    return f"{prefix}.{remote}"


def replicator_producer_name(local: str, remote: str, prefix: str = REPLICATOR_PREFIX) -> str:
    """The producer name the replicator publishes with on ``remote`` (Pulsar 4.x)."""
    return f"{prefix}.{local}{PRODUCER_NAME_DELIMITER}{remote}"


def is_replicator_producer(producer_name: str, prefix: str = REPLICATOR_PREFIX) -> bool:
    """True for a producer that is another cluster's replicator (Pulsar's ``isRemote``)."""
    return producer_name.startswith(prefix)


def inbound_cluster(producer_name: str, local: str, prefix: str = REPLICATOR_PREFIX) -> str | None:
    """The cluster a replicator producer named ``pulsar.repl.{c}-->{local}`` comes from."""
    head = prefix + "."
    tail = PRODUCER_NAME_DELIMITER + local
    if producer_name.startswith(head) and producer_name.endswith(tail):
        return producer_name[len(head) : -len(tail)] or None
    return None


def remote_clusters(replication_clusters: Iterable[str] | None, local: str) -> list[str]:
    """The clusters a namespace's topics replicate to: its ``replication_clusters`` but this
    one, sorted (none when replication is not set)."""
    return sorted({c for c in replication_clusters or () if c != local})


def should_forward(md: pb.MessageMetadata, remote: str) -> bool:
    """Whether an entry with metadata ``md`` goes to ``remote``."""
    if md.HasField("replicated_from"):
        return False
    if md.replicate_to:
        return remote in md.replicate_to
    return True


def forward_section(md: pb.MessageMetadata, payload: bytes | memoryview, local: str) -> bytes:
    """The payload section to send to the remote: the same metadata with ``replicated_from``
    set to ``local``, and the payload untouched (a batch stays the same batch)."""
    out = pb.MessageMetadata()
    out.CopyFrom(md)
    out.replicated_from = local
    return encode_payload_section(out, payload)


def dedup_producer_name(producer_name: str, data: bytes, prefix: str = REPLICATOR_PREFIX) -> str:
    """The name deduplication keys a send by: the original producer's for a replicator (so
    its resends after a failure are recognised, as Pulsar's ``isDuplicateReplV1``), else the
    producer's own."""
    if not is_replicator_producer(producer_name, prefix):
        return producer_name
    try:
        md, _ = split_payload(data)
    except ProtocolError:  # a malformed entry is refused further on; keep the producer's name
        return producer_name
    return md.producer_name or producer_name


class Backoff:
    """Pulsar's replicator back-off: ``initial`` doubling on each failure up to ``maximum``,
    back to ``initial`` once a connection works."""

    def __init__(self, initial: float = 0.1, maximum: float = 60.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt (and double the one after)."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        """A connection worked: the next failure waits ``initial`` again."""
        self._next = self.initial
