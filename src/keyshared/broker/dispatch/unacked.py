"""``maxUnackedMessagesPerSubscription``: a Shared or Key_Shared dispatcher stops at the limit.

Pulsar's ``PersistentDispatcherMultipleConsumers.addUnAckedMessages``: once the subscription's
consumers together hold ``limit`` unacked messages or more, the dispatcher is blocked
(``blockedSubscriptionOnUnackedMsgs``); it is unblocked when they hold fewer than half the
limit (strictly fewer, where a consumer's own limit unblocks at half or less), or hold none: a
limit of 1 would otherwise block it for good, as it does in Pulsar. 0 disables it.

Two choices beyond Pulsar, both so that the limit means what it says:

* while blocked, nothing is dispatched at all: Pulsar still replays queued entries, so a
  Key_Shared look-ahead queue could carry the subscription past its limit by thousands;
* a read never asks for more entries than the room left under the limit, so one read cannot
  overshoot it by a whole read batch (a batch entry can still carry several messages).

The limit is a function (the topic policy resolves it), read each time, so a policy change
applies to a live subscription.
"""

from __future__ import annotations

from collections.abc import Callable


class SubscriptionUnackedLimit:
    """The block state of one subscription's unacked limit, with its hysteresis."""

    __slots__ = ("_limit", "blocked")

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.blocked = False

    @property
    def limit(self) -> int:
        """The limit in force (0 or less: none)."""
        return self._limit()

    def update(self, unacked: int) -> bool:
        """Re-evaluate with the subscription's ``unacked`` messages; True if this unblocked it."""
        limit = self._limit()
        if limit <= 0:
            was = self.blocked
            self.blocked = False
            return was
        if not self.blocked:
            self.blocked = unacked >= limit
            return False
        if unacked < limit // 2 or unacked == 0:
            self.blocked = False
            return True
        return False

    def room(self, unacked: int) -> int | None:
        """Messages that may still go out before the limit (None when there is no limit)."""
        limit = self._limit()
        if limit <= 0:
            return None
        return 0 if self.blocked else max(limit - unacked, 0)
