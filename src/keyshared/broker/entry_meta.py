"""What the broker reads from an entry's MessageMetadata, parsed once and cached."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, TypeAlias

from keyshared.protocol import sticky_key_hash
from keyshared.protocol.metadata import broker_fields
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

# Entries whose metadata is kept, for the whole broker (one cache is shared by every topic: ledger
# ids are unique in a storage, so positions never collide). A miss only costs a parse (a few
# microseconds), and what dispatch asks for is mostly what was just published. Each entry costs
# about 250 bytes (key and value tuples, their ints, the dict slot): 100,000 are about 25 MB. The
# limit was 200,000 *per topic*: a topic's cache grew to 50 MB even when every entry in it was
# long acked, and the soak's six busy topics held 1.2 million (about 300 MB).
CACHE_LIMIT = 100_000


_new_meta = tuple.__new__


class EntryMeta(NamedTuple):
    """The few metadata fields dispatch needs: batch size, key hash, times.

    A NamedTuple so that the cache can keep the plain tuple of its values (see
    ``EntryMetaCache``) and rebuild it cheaply.
    """

    num_messages: int
    key_hash: int
    publish_time: int
    deliver_at_time: int
    event_time: int
    marker_type: int = 0
    """Non-zero for a server-only marker entry (never delivered to consumers)."""


MetaFields: TypeAlias = tuple[int, int, int, int, int, int]
"""The values of an :class:`EntryMeta` as a plain tuple, as the cache keeps them."""


def parse_entry_fields(data: bytes) -> MetaFields:
    """:func:`parse_entry_meta` as a plain tuple, for :meth:`EntryMetaCache.put_fields` (the
    publish path's way: the tuple the cache keeps, built once)."""
    n, key, publish_time, deliver_at_time, event_time, marker_type = broker_fields(data)
    return (n, sticky_key_hash(key), publish_time, deliver_at_time, event_time, marker_type)


def parse_entry_meta(data: bytes) -> EntryMeta:
    """Parse the metadata at the head of a stored entry (metadataSize + MessageMetadata + ...)."""
    return _new_meta(EntryMeta, parse_entry_fields(data))


class EntryMetaCache:
    """Cache of parsed metadata, filled on publish and on first dispatch; the broker shares one
    between all its topics (``BrokerService.entry_meta_cache``), bounded at ``limit`` entries.

    Keys and values are kept as plain tuples of ints, which the cyclic garbage collector stops
    tracking (instances of ``Position`` and ``EntryMeta``, tuple subclasses, stay tracked and
    made every full collection walk the whole cache); ``get`` wraps the value again.
    """

    __slots__ = ("_cache", "_limit")

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self._cache: dict[tuple[int, int], MetaFields] = {}
        self._limit = max(1, limit)

    def __len__(self) -> int:
        return len(self._cache)

    def put(self, position: Position, meta: EntryMeta) -> None:
        """Remember ``meta`` for ``position``, dropping the oldest entries past the limit."""
        self.put_fields(position, (meta[0], meta[1], meta[2], meta[3], meta[4], meta[5]))

    def put_fields(self, position: Position, fields: MetaFields) -> None:
        """:meth:`put` of the values of an :class:`EntryMeta` given as a plain tuple, which
        is kept as it is."""
        cache = self._cache
        cache[(position[0], position[1])] = fields
        if len(cache) > self._limit:
            # dicts keep insertion order: drop the oldest tenth in one pass.
            for key in list(cache)[: max(1, self._limit // 10)]:
                del cache[key]

    def get(self, position: Position, data: bytes) -> EntryMeta:
        """The metadata of the entry at ``position`` whose bytes are ``data``."""
        # A Position hashes and compares equal to the plain tuple it was stored under.
        cached = self._cache.get(position)
        if cached is None:
            cached = parse_entry_fields(data)
            self.put_fields(position, cached)
        return _new_meta(EntryMeta, cached)

    def marker_type(self, position: Position, data: bytes) -> int:
        """The ``marker_type`` of the entry at ``position`` (0: a message), without building
        the whole tuple: dispatch asks it of every entry it reads."""
        cached = self._cache.get(position)
        if cached is None:
            return self.get(position, data).marker_type
        return cached[5]

    def has_marker(self, entries: Iterable[Entry]) -> bool:
        """Whether any of ``entries`` is a marker: dispatch asks it of every read, so it is
        one tight loop over the cache."""
        get = self._cache.get
        for e in entries:
            cached: tuple[int, ...] | None = get(e.position)
            if cached is None:
                cached = self.get(e.position, e.data)
            if cached[5]:
                return True
        return False

    def batch_size(self, position: Position) -> int | None:
        """The number of messages of the entry at ``position``, if cached."""
        cached = self._cache.get(position)
        return cached[0] if cached is not None else None

    def publish_time(self, position: Position) -> int | None:
        """The publish time (epoch ms) of the entry at ``position``, if cached."""
        cached = self._cache.get(position)
        return cached[2] if cached is not None else None

    def clear(self) -> None:
        """Forget everything."""
        self._cache.clear()
