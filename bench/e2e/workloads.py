"""The benchmark matrix: which cells run, with how many messages, and how to select them.

A *throughput cell* is one combination of payload size, batching mode, producer processes,
subscription type, consumer processes and key space; a *latency cell* is one paced publish
probe (rate, payload size, and optionally a second producer loading the broker meanwhile).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

Subscription = Literal["none", "exclusive", "shared", "key_shared"]
Batching = Literal["off", "default", "keybased"]

SIZES = (100, 1024)
BATCHINGS: tuple[Batching, ...] = ("off", "default", "keybased")
PRODUCER_COUNTS = (1, 4)
SUBSCRIPTIONS: tuple[Subscription, ...] = ("none", "exclusive", "shared", "key_shared")
# Exclusive admits one consumer; Shared and Key_Shared run with 1, 4 and 16 consumer processes.
CONSUMER_COUNTS = (1, 4, 16)
KEY_SPACES = (1_000, 100_000)
LATENCY_RATES = (1_000, 10_000)
LATENCY_PROBE_RATE = 1_000
LATENCY_BACKGROUND_RATE = 10_000

_BATCHING_LABEL = {"off": "nobatch", "default": "batch", "keybased": "batch-keybased"}


def keys_matter(subscription: Subscription, batching: Batching) -> bool:
    """Whether the key space changes the work: Key_Shared routes by key, key-based batching
    batches by key. Elsewhere the key is only carried along, so one key space is run."""
    return subscription == "key_shared" or batching == "keybased"


@dataclass(frozen=True)
class Workload:
    """One throughput cell; ``subscription == "none"`` means produce only (no consumer)."""

    size: int
    batching: Batching
    producers: int
    subscription: Subscription
    consumers: int
    keys: int
    messages: int

    @property
    def name(self) -> str:
        """A stable identifier used in JSON, logs, tables and ``--cells`` patterns.

        For example ``e2e-key_shared-x4/100B/batch-keybased/1p/keys100000``.
        """
        if self.subscription == "none":
            kind = "produce"
        elif self.subscription == "exclusive":
            kind = "e2e-exclusive"
        else:
            kind = f"e2e-{self.subscription}-x{self.consumers}"
        return (
            f"{kind}/{self.size}B/{_BATCHING_LABEL[self.batching]}/{self.producers}p/"
            f"keys{self.keys}"
        )

    @property
    def batched(self) -> bool:
        """True with any batching (default or key-based)."""
        return self.batching != "off"

    def as_dict(self) -> dict[str, object]:
        """The cell as plain JSON-ready data, with its name."""
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class LatencyCell:
    """A paced, non-batched publish probe; ``background_rate`` > 0 adds a second producer
    (non-batched, its own topic, same broker) running at that rate for the whole probe."""

    size: int
    rate: int
    background_rate: int = 0

    @property
    def name(self) -> str:
        """For example ``latency/100B/1000/s+bg10000``."""
        background = f"+bg{self.background_rate}" if self.background_rate else ""
        return f"latency/{self.size}B/{self.rate}/s{background}"

    def as_dict(self) -> dict[str, object]:
        """The cell as plain JSON-ready data, with its name."""
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class MessageBudget:
    """How many messages one run sends, by payload size and batching.

    Key-based batching gets the unbatched budget: at the rates reached here each key's batch
    holds about one message when the 5 ms batch delay fires (1,000 keys or more), so its
    entries are as many and as small as unbatched ones.
    """

    batched_small: int
    batched_large: int
    unbatched_small: int
    unbatched_large: int

    def messages(self, size: int, batching: Batching, producers: int) -> int:
        """Messages for one run, rounded down to a multiple of ``producers``."""
        if batching == "default":
            total = self.batched_small if size <= 100 else self.batched_large
        else:
            total = self.unbatched_small if size <= 100 else self.unbatched_large
        return total - total % producers


FULL_BUDGET = MessageBudget(
    batched_small=200_000, batched_large=100_000, unbatched_small=50_000, unbatched_large=50_000
)
QUICK_BUDGET = MessageBudget(
    batched_small=20_000, batched_large=20_000, unbatched_small=10_000, unbatched_large=10_000
)


def _consumer_counts(subscription: Subscription) -> tuple[int, ...]:
    if subscription == "none":
        return (0,)
    if subscription == "exclusive":
        return (1,)
    return CONSUMER_COUNTS


def matrix(budget: MessageBudget) -> list[Workload]:
    """Every throughput cell of the issue's matrix.

    Ordered so that the cells compared with each other (produce only, Exclusive, Shared and
    Key_Shared of the same size, batching, producers and keys) run next to each other, in the
    same window of machine load.
    """
    cells: list[Workload] = []
    for size in SIZES:
        for batching in BATCHINGS:
            for producers in PRODUCER_COUNTS:
                for keys in KEY_SPACES:
                    for subscription in SUBSCRIPTIONS:
                        if keys != KEY_SPACES[0] and not keys_matter(subscription, batching):
                            continue
                        for consumers in _consumer_counts(subscription):
                            cells.append(
                                Workload(
                                    size=size,
                                    batching=batching,
                                    producers=producers,
                                    subscription=subscription,
                                    consumers=consumers,
                                    keys=keys,
                                    messages=budget.messages(size, batching, producers),
                                )
                            )
    return cells


def latency_matrix(sizes: Sequence[int] = SIZES) -> list[LatencyCell]:
    """Paced probes at 1,000 and 10,000 msg/s, and 1,000 msg/s beside a 10,000 msg/s producer."""
    cells = [LatencyCell(size=size, rate=rate) for size in sizes for rate in LATENCY_RATES]
    cells += [
        LatencyCell(size=size, rate=LATENCY_PROBE_RATE, background_rate=LATENCY_BACKGROUND_RATE)
        for size in sizes
    ]
    return cells


# (subscription, consumers, size, batching, producers, keys): every value of every dimension
# at least once, and every subscription type, so a smoke run exercises every code path.
SMOKE_CELLS: tuple[tuple[Subscription, int, int, Batching, int, int], ...] = (
    ("exclusive", 1, 100, "default", 1, 1_000),
    ("shared", 4, 1024, "off", 4, 1_000),
    ("key_shared", 16, 100, "keybased", 4, 100_000),
    ("key_shared", 1, 1024, "off", 1, 1_000),
    ("none", 0, 1024, "default", 1, 1_000),
    ("none", 0, 100, "keybased", 4, 100_000),
)


def smoke_matrix(budget: MessageBudget) -> list[Workload]:
    """A six-cell cover of the matrix, for ``--quick``."""
    return [
        Workload(
            size=size,
            batching=batching,
            producers=producers,
            subscription=subscription,
            consumers=consumers,
            keys=keys,
            messages=budget.messages(size, batching, producers),
        )
        for subscription, consumers, size, batching, producers, keys in SMOKE_CELLS
    ]


def smoke_latency_matrix() -> list[LatencyCell]:
    """The three kinds of latency probe at 100 B, for ``--quick``."""
    return latency_matrix(sizes=SIZES[:1])


@dataclass(frozen=True)
class Selection:
    """Which cells to run: each dimension filter is ``None`` (any) or the values allowed;
    ``patterns`` are ``fnmatch`` globs or plain substrings matched against cell names (any
    one matching selects the cell)."""

    sizes: frozenset[int] | None = None
    batchings: frozenset[str] | None = None
    producers: frozenset[int] | None = None
    subscriptions: frozenset[str] | None = None
    consumers: frozenset[int] | None = None
    keys: frozenset[int] | None = None
    patterns: tuple[str, ...] = field(default_factory=tuple)

    def _name_selected(self, name: str) -> bool:
        if not self.patterns:
            return True
        return any(
            fnmatch.fnmatchcase(name, pattern)
            if any(c in pattern for c in "*?[")
            else (pattern in name)
            for pattern in self.patterns
        )

    def throughput(self, cells: Iterable[Workload]) -> list[Workload]:
        """The selected throughput cells, in order."""
        return [
            cell
            for cell in cells
            if (self.sizes is None or cell.size in self.sizes)
            and (self.batchings is None or cell.batching in self.batchings)
            and (self.producers is None or cell.producers in self.producers)
            and (self.subscriptions is None or cell.subscription in self.subscriptions)
            and (
                self.consumers is None
                or cell.subscription == "none"
                or cell.consumers in self.consumers
            )
            and (self.keys is None or cell.keys in self.keys)
            and self._name_selected(cell.name)
        ]

    def latency(self, cells: Iterable[LatencyCell]) -> list[LatencyCell]:
        """The selected latency cells (only the size filter and the patterns apply)."""
        return [
            cell
            for cell in cells
            if (self.sizes is None or cell.size in self.sizes) and self._name_selected(cell.name)
        ]
