"""Key_Shared sticky-key consumer selectors: which consumer serves which key hash.

Pure, synchronous and deterministic. The dispatcher hashes an entry's sticky key with
``selector.sticky_key_hash(key)`` (each selector's exact slot formula), asks ``select(hash)`` for
the owner, and on every ``add_consumer``/``remove_consumer`` gets back the :class:`ImpactedRanges`
(which hashes moved from whom to whom), from which it starts draining (PIP-379).

Which selector (Pulsar's ``PersistentStickyKeyDispatcherMultipleConsumers`` constructor):

========================================================  ==========================================
AUTO_SPLIT, ``subscriptionKeySharedUseConsistentHashing``  :class:`ConsistentHashingStickyKeyConsumerSelector`
AUTO_SPLIT, consistent hashing off                         :class:`HashRangeAutoSplitStickyKeyConsumerSelector`
STICKY                                                     :class:`HashRangeExclusiveStickyKeyConsumerSelector`
========================================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from keyshared.broker.dispatch.selectors.autosplit import (
    HashRangeAutoSplitStickyKeyConsumerSelector,
)
from keyshared.broker.dispatch.selectors.base import (
    C,
    ConsumerAssignError,
    HashRange,
    NamedConsumer,
)
from keyshared.broker.dispatch.selectors.consistent import (
    DEFAULT_REPLICA_POINTS,
    ConsistentHashingStickyKeyConsumerSelector,
)
from keyshared.broker.dispatch.selectors.exclusive import (
    HashRangeExclusiveStickyKeyConsumerSelector,
)
from keyshared.broker.dispatch.selectors.hashing import (
    DEFAULT_RANGE_SIZE,
    STICKY_KEY_HASH_NOT_SET,
    consistent_hashing_slot,
    hash_range_slot,
    make_sticky_key_hash,
    pulsar_hash,
)
from keyshared.broker.dispatch.selectors.ranges import (
    Assignment,
    ImpactedRanges,
    RangeMove,
    RemovedHashRanges,
    diff_assignments,
    merge_ranges,
)

if TYPE_CHECKING:
    from keyshared.config import BrokerConfig

__all__ = [
    "DEFAULT_RANGE_SIZE",
    "DEFAULT_REPLICA_POINTS",
    "STICKY_KEY_HASH_NOT_SET",
    "Assignment",
    "ConsistentHashingStickyKeyConsumerSelector",
    "ConsumerAssignError",
    "HashRange",
    "HashRangeAutoSplitStickyKeyConsumerSelector",
    "HashRangeExclusiveStickyKeyConsumerSelector",
    "ImpactedRanges",
    "NamedConsumer",
    "RangeMove",
    "RemovedHashRanges",
    "StickyKeyConsumerSelector",
    "consistent_hashing_slot",
    "create_selector",
    "diff_assignments",
    "hash_range_slot",
    "make_sticky_key_hash",
    "merge_ranges",
    "pulsar_hash",
    "selector_for",
]


class StickyKeyConsumerSelector(Protocol[C]):
    """The interface every selector implements (Pulsar's ``StickyKeyConsumerSelector``)."""

    @property
    def key_hash_range_size(self) -> int:
        """Size of the hash space the client sees (65536)."""
        ...

    @property
    def key_hash_range(self) -> HashRange:
        """The inclusive slot range this selector assigns: (1, 65535) or (0, 65535)."""
        ...

    def sticky_key_hash(self, key: bytes) -> int:
        """This selector's exact slot formula for a sticky key; never 0."""
        ...

    def add_consumer(
        self, consumer: C, ranges: Sequence[HashRange] | None = None
    ) -> ImpactedRanges[C]:
        """Add ``consumer`` (STICKY: with its ``ranges``); returns what moved.

        Raises ``ConsumerAssignError`` if the consumer cannot be given hashes, ``ValueError`` if it
        is already present.
        """
        ...

    def remove_consumer(self, consumer: C) -> ImpactedRanges[C]:
        """Remove ``consumer`` (no-op if absent); returns what moved."""
        ...

    def select(self, sticky_key_hash: int) -> C | None:
        """The consumer serving ``sticky_key_hash`` now, or ``None`` (no consumer / STICKY gap)."""
        ...

    def select_key(self, key: bytes) -> C | None:
        """``select(sticky_key_hash(key))``."""
        ...

    def get_assignments(self) -> list[Assignment[C]]:
        """Sorted, disjoint ``(start, end, consumer)`` list (Pulsar's assignments snapshot)."""
        ...

    def get_consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        """Each consumer's merged, sorted inclusive ranges (stats ``keyHashRangeArrays``)."""
        ...

    def consumers(self) -> list[C]:
        """The consumers in the selector, in the order they were added."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, consumer: object) -> bool: ...


def create_selector(
    key_shared_mode: str = "AUTO_SPLIT",
    *,
    use_consistent_hashing: bool = True,
    replica_points: int = DEFAULT_REPLICA_POINTS,
) -> StickyKeyConsumerSelector[C]:
    """The selector Pulsar picks for a Key_Shared mode and the broker settings.

    ``key_shared_mode`` is ``"AUTO_SPLIT"`` or ``"STICKY"``; ``use_consistent_hashing`` is
    ``subscriptionKeySharedUseConsistentHashing``; ``replica_points`` is
    ``subscriptionKeySharedConsistentHashingReplicaPoints``.
    """
    mode = key_shared_mode.upper()
    if mode == "STICKY":
        return HashRangeExclusiveStickyKeyConsumerSelector()
    if mode != "AUTO_SPLIT":
        raise ValueError(f"unknown key_shared_mode {key_shared_mode!r}")
    if use_consistent_hashing:
        return ConsistentHashingStickyKeyConsumerSelector(replica_points)
    return HashRangeAutoSplitStickyKeyConsumerSelector()


def selector_for(key_shared_mode: str, config: BrokerConfig) -> StickyKeyConsumerSelector[C]:
    """:func:`create_selector` for a subscription's Key_Shared mode under the broker's
    ``subscriptionKeySharedUseConsistentHashing`` and ``...ConsistentHashingReplicaPoints``."""
    return create_selector(
        key_shared_mode,
        use_consistent_hashing=config.subscriptionKeySharedUseConsistentHashing,
        replica_points=config.subscriptionKeySharedConsistentHashingReplicaPoints,
    )
