"""The benchmark matrix: which configurations run, with how many messages."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Subscription = Literal["exclusive", "key_shared", "none"]

SIZES = (100, 1024)
PRODUCER_COUNTS = (1, 4)
KEY_SPACE = 10_000


@dataclass(frozen=True)
class Workload:
    """One throughput configuration; ``subscription == "none"`` means produce only."""

    size: int
    batching: bool
    producers: int
    subscription: Subscription
    messages: int
    key_based_batching: bool = False
    # Consumer processes on the subscription (Key_Shared only: Exclusive admits one).
    consumers: int = 1

    @property
    def name(self) -> str:
        """A stable, human-readable identifier used in JSON and tables."""
        if self.batching:
            batching = "batch-keybased" if self.key_based_batching else "batch"
        else:
            batching = "nobatch"
        kind = "produce" if self.subscription == "none" else f"e2e-{self.subscription}"
        name = f"{kind}/{self.size}B/{batching}/{self.producers}p"
        return name + (f"/{self.consumers}c" if self.consumers > 1 else "")

    def as_dict(self) -> dict[str, object]:
        """The configuration as plain JSON-ready data, with its name."""
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class MessageBudget:
    """How many messages one run sends, by payload size and batching."""

    batched_small: int
    batched_large: int
    unbatched_small: int
    unbatched_large: int

    def messages(self, size: int, batching: bool, producers: int) -> int:
        """Messages for one run, rounded down to a multiple of ``producers``."""
        if batching:
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


def matrix(
    budget: MessageBudget,
    include_produce_only: bool = True,
    key_shared_key_based: bool = True,
    *,
    exclusive_key_based: bool = False,
    key_shared_consumers: tuple[int, ...] = (1,),
) -> list[Workload]:
    """Every configuration of the issue's matrix, end-to-end first, then produce-only.

    Batched Key_Shared runs use key-based batching (what Pulsar recommends for Key_Shared)
    unless ``key_shared_key_based`` is false; batched Exclusive runs use it only with
    ``exclusive_key_based`` (to compare both subscriptions on the same producer workload).
    Key_Shared runs once per entry of ``key_shared_consumers``.
    """
    subscriptions: list[Subscription] = ["exclusive", "key_shared"]
    if include_produce_only:
        subscriptions.append("none")
    workloads: list[Workload] = []
    for subscription in subscriptions:
        for batching in (True, False):
            for size in SIZES:
                for producers in PRODUCER_COUNTS:
                    key_based = key_shared_key_based if subscription == "key_shared" else False
                    if subscription == "exclusive":
                        key_based = exclusive_key_based
                    counts = key_shared_consumers if subscription == "key_shared" else (1,)
                    for consumers in counts:
                        workloads.append(
                            Workload(
                                size=size,
                                batching=batching,
                                producers=producers,
                                subscription=subscription,
                                messages=budget.messages(size, batching, producers),
                                key_based_batching=batching and key_based,
                                consumers=consumers,
                            )
                        )
    return workloads


# (subscription, size, batching, producers): every value of every dimension at least once, and
# each subscription kind with batching on and off, so a smoke run exercises every code path.
SMOKE_CELLS: tuple[tuple[Subscription, int, bool, int], ...] = (
    ("exclusive", 100, True, 1),
    ("exclusive", 1024, False, 4),
    ("key_shared", 100, True, 4),
    ("key_shared", 1024, False, 1),
    ("none", 1024, True, 1),
    ("none", 100, False, 4),
)


def smoke_matrix(budget: MessageBudget, key_shared_key_based: bool = True) -> list[Workload]:
    """A six-configuration cover of the matrix, for ``--quick``."""
    return [
        Workload(
            size=size,
            batching=batching,
            producers=producers,
            subscription=subscription,
            messages=budget.messages(size, batching, producers),
            key_based_batching=batching and subscription == "key_shared" and key_shared_key_based,
        )
        for subscription, size, batching, producers in SMOKE_CELLS
    ]
