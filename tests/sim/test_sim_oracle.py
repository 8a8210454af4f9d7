"""The oracle can fail: break the dispatcher on purpose and the simulation must notice, soon.

Each test plants one bug with ``monkeypatch`` and runs seeds until one fails with the expected
property (a bounded number: the seeds are fixed, so this is deterministic).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from keyshared.broker.consumer import Consumer
from keyshared.broker.dispatch.base import Dispatcher
from keyshared.broker.dispatch.draining import DrainingHashesTracker
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from keyshared.broker.dispatch.shared import ReplayQueue, SharedDispatcher
from keyshared.broker.dispatch.unacked import SubscriptionUnackedLimit
from keyshared.storage.cursor import ManagedCursor
from tests.sim.simulator import Params, SimFailure, is_classic, run_seed, sub_unacked_limit

BUDGET = 400


def first_failure(
    expect: str, budget: int = BUDGET, seeds: Iterable[int] | None = None
) -> SimFailure:
    """The first seed (of the first ``budget``, or of ``seeds``) failing with ``expect``."""
    seen: list[str] = []
    for seed in range(budget) if seeds is None else seeds:
        try:
            run_seed(seed, trace=False)
        except SimFailure as failure:
            if expect in failure.message:
                return failure
            seen.append(failure.message.splitlines()[0])
    raise AssertionError(f"no seed of {budget} broke {expect!r}; other failures: {seen[:5]}")


def _never(*_: Any, **__: Any) -> bool:
    return False


def test_without_draining_exclusivity_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DrainingHashesTracker, "should_block_sticky_key_hash", _never)
    monkeypatch.setattr(DrainingHashesTracker, "would_block", _never)
    failure = first_failure("exclusivity")
    assert "replay: SIM_SEED=" in str(failure)


def test_without_replay_hash_hold_back_order_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReplayQueue, "contains_hash", _never)
    first_failure("order")


def test_losing_redeliveries_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original: Callable[..., None] = SharedDispatcher.add_to_replay

    def lossy(self: SharedDispatcher, pos: Any, key_hash: int) -> None:
        if key_hash:  # entries of leaving consumers and held-back entries vanish
            return
        original(self, pos, key_hash)

    monkeypatch.setattr(SharedDispatcher, "add_to_replay", lossy)
    first_failure("not everything acked")


def test_stale_reads_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the cursor epoch and the dispatcher's read generations, a read in flight across a
    # rewind, a reset-cursor or the last consumer leaving lands as if nothing happened.
    def forget_flags_only(self: Dispatcher) -> None:
        self.have_pending_read = False
        self.have_pending_replay_read = False

    monkeypatch.setattr(Dispatcher, "forget_reads", forget_flags_only)
    monkeypatch.setattr(ManagedCursor, "_new_epoch", lambda self: None)
    first_failure("")


def classic_seeds(start: int, stop: int) -> list[int]:
    """The seeds of ``start .. stop - 1`` that run the classic dispatcher."""
    return [s for s in range(start, stop) if is_classic(s)]


def test_classic_without_the_moved_hash_hold_back_exclusivity_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A consumer then gets entries of a key moved to it (redeliveries, while it is recently
    # joined) while the consumer the key moved away from still holds earlier entries of it.
    monkeypatch.setattr(ClassicKeySharedDispatcher, "_held_elsewhere", _never)
    failure = first_failure("exclusivity", seeds=classic_seeds(0, 1300))
    assert is_classic(failure.seed)


def _seeds_with(pred: Callable[[int], bool], count: int) -> list[int]:
    """The first ``count`` seeds satisfying ``pred``."""
    out: list[int] = []
    seed = 0
    while len(out) < count:
        if pred(seed):
            out.append(seed)
        seed += 1
    return out


def test_a_subscription_not_blocked_at_its_unacked_limit_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SubscriptionUnackedLimit, "update", lambda self, unacked: False)
    seeds = _seeds_with(lambda s: sub_unacked_limit(s) > 0, 200)
    failure = first_failure("while the subscription is blocked", seeds=seeds)
    assert "maxUnackedMessagesPerSubscription" in failure.message


def test_a_consumer_unblocked_before_half_its_limit_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def eager(self: Consumer) -> int:
        # Unblocked as soon as it is below the limit, not at half of it.
        if self.blocked_on_unacked and self.unacked_messages < self.max_unacked_messages:
            self.blocked_on_unacked = False
            released, self.permits_while_blocked = self.permits_while_blocked, 0
            self.available_permits += released
            return max(released, 1)
        return 0

    monkeypatch.setattr(Consumer, "_maybe_unblock", eager)
    seeds = _seeds_with(lambda s: Params.draw(random.Random(s)).max_unacked > 0, 600)
    failure = first_failure("while blocked", seeds=seeds)
    assert "maxUnackedMessagesPerConsumer" in failure.message
