"""What the broker reads from an entry's MessageMetadata, parsed once and cached."""

from __future__ import annotations

from dataclasses import dataclass

from keyshared.protocol import num_messages, parse_metadata, sticky_key, sticky_key_hash
from keyshared.storage.position import Position

# Enough to cover every entry in flight in dispatch on a busy broker without growing unbounded.
_CACHE_LIMIT = 200_000


@dataclass(slots=True, frozen=True)
class EntryMeta:
    """The few metadata fields dispatch needs: batch size, key hash, times."""

    num_messages: int
    key_hash: int
    publish_time: int
    deliver_at_time: int
    event_time: int


def parse_entry_meta(data: bytes) -> EntryMeta:
    """Parse the metadata at the head of a stored entry (metadataSize + MessageMetadata + ...)."""
    md = parse_metadata(data)
    return EntryMeta(
        num_messages=num_messages(md),
        key_hash=sticky_key_hash(sticky_key(md)),
        publish_time=md.publish_time,
        deliver_at_time=md.deliver_at_time if md.HasField("deliver_at_time") else 0,
        event_time=md.event_time,
    )


class EntryMetaCache:
    """Per-topic cache of parsed metadata, filled on publish and on first dispatch."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[Position, EntryMeta] = {}

    def put(self, position: Position, meta: EntryMeta) -> None:
        """Remember ``meta`` for ``position``, dropping the oldest entries past the limit."""
        cache = self._cache
        cache[position] = meta
        if len(cache) > _CACHE_LIMIT:
            # dicts keep insertion order: drop the oldest tenth in one pass.
            for key in list(cache)[: _CACHE_LIMIT // 10]:
                del cache[key]

    def get(self, position: Position, data: bytes) -> EntryMeta:
        """The metadata of the entry at ``position`` whose bytes are ``data``."""
        meta = self._cache.get(position)
        if meta is None:
            meta = parse_entry_meta(data)
            self.put(position, meta)
        return meta

    def clear(self) -> None:
        """Forget everything (topic deleted)."""
        self._cache.clear()
