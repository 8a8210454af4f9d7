"""A zoo of Apache Pulsar's own Key_Shared ordering and stuck-delivery bugs, re-created on ours.

Each :class:`Fault` names a Pulsar issue, says what went wrong there, and puts the same mistake
back into our dispatcher for the duration of a ``with fault.installed():`` block, by replacing
one method or attribute of a broker class (as ``pytest.MonkeyPatch`` does, undone on exit).
Nothing in ``src/`` knows about faults: the production code has no flag to branch on.

``test_sim_zoo`` checks that the seeded simulation catches each within the seeds that
``make test`` runs. From the command line::

    .venv/bin/python -m tests.sim.zoo                       # list the zoo
    .venv/bin/python -m tests.sim.zoo --fault NAME --seed S  # replay a seed with the fault in
    .venv/bin/python -m tests.sim.zoo --survey 3000          # seeds to catch each, per fault
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest

from keyshared.broker.dispatch.draining import DrainingHashesTracker
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from keyshared.broker.dispatch.selectors.base import C
from keyshared.broker.dispatch.selectors.hashing import STICKY_KEY_HASH_NOT_SET
from keyshared.broker.dispatch.selectors.ranges import ImpactedRanges, RemovedHashRanges
from keyshared.broker.dispatch.shared import ReplayQueue, SharedDispatcher
from tests.sim.conftest import DEFAULT_SEEDS
from tests.sim.simulator import SimFailure, is_classic, run_seed


@dataclass(frozen=True)
class Fault:
    """One historical bug: where it was reported, what went wrong, and how it is put back."""

    name: str
    issues: str
    dispatcher: str  # "pip379", "classic" or "any": the seeds that can show it
    went_wrong: str
    recreated: str
    expect: tuple[str, ...]  # a failure message containing any of these is the catch
    install: Callable[[pytest.MonkeyPatch], None]

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The fault is in for the duration of the block."""
        mp = pytest.MonkeyPatch()
        try:
            self.install(mp)
            yield
        finally:
            mp.undo()

    def seeds(self, start: int, stop: int) -> list[int]:
        """The seeds of ``start .. stop - 1`` that run this fault's dispatcher."""
        if self.dispatcher == "any":
            return list(range(start, stop))
        classic = self.dispatcher == "classic"
        return [s for s in range(start, stop) if is_classic(s) == classic]

    def caught_by(self, failure: SimFailure) -> bool:
        """Whether ``failure`` is this fault being caught (not some other property)."""
        return any(e in failure.message for e in self.expect)


# --- the faults ------------------------------------------------------------------------------


def _no_draining_registered(mp: pytest.MonkeyPatch) -> None:
    def register(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    mp.setattr(DrainingHashesTracker, "register_draining_hashes", register)


def _no_moved_hash_hold_back(mp: pytest.MonkeyPatch) -> None:
    def held_elsewhere(self: Any, consumer: Any, key_hash: int) -> bool:
        return False

    mp.setattr(ClassicKeySharedDispatcher, "_held_elsewhere", held_elsewhere)


def _reads_blind_to_requeues(mp: pytest.MonkeyPatch) -> None:
    # Both memories a read has of the replay queue as it was when the read was issued read as
    # "nothing", and writes to them are dropped: the queue's lowest position added (with its
    # hash) since the last replay read, and the dispatcher's head of the queue at the read.
    nothing = property(lambda self: None, lambda self, value: None)
    mp.setattr(ReplayQueue, "min_added_with_hash", nothing)
    mp.setattr(SharedDispatcher, "_min_replayed", nothing, raising=False)


def _draining_counted_twice(mp: pytest.MonkeyPatch) -> None:
    # Pulsar 4.0's registerDrainingHashes: no clearing of a hash that moved back to the
    # consumer draining it, and the pending entries added to a surviving count, not set.
    def start(
        self: DrainingHashesTracker[C],
        consumer: C,
        removed_ranges: RemovedHashRanges,
        pending_sticky_hashes: Iterable[int],
    ) -> int:
        hashes = set()
        for sticky_hash in pending_sticky_hashes:
            if sticky_hash != STICKY_KEY_HASH_NOT_SET and removed_ranges.contains_sticky_key(
                sticky_hash
            ):
                self.add_entry(consumer, sticky_hash)
                hashes.add(sticky_hash)
        return len(hashes)

    def register(
        self: DrainingHashesTracker[C],
        impacted: ImpactedRanges[C],
        pending_sticky_hashes_of: Callable[[C], Iterable[int]],
        skip: C | None = None,
    ) -> None:
        for consumer, removed in impacted.removed_ranges_by_consumer().items():
            if consumer is not skip:
                self.start_draining_hashes_for_consumer(
                    consumer, removed, pending_sticky_hashes_of(consumer)
                )

    mp.setattr(DrainingHashesTracker, "start_draining_hashes_for_consumer", start)
    mp.setattr(DrainingHashesTracker, "register_draining_hashes", register)


ORDER = ("exclusivity", "order:")
STUCK = ("stuck", "idle stall", "still draining", "not everything acked", "not done after")

ZOO: tuple[Fault, ...] = (
    Fault(
        name="moved-hash-not-held",
        issues="apache/pulsar#7455 (also #6554, #4077)",
        dispatcher="pip379",
        went_wrong=(
            "Key_Shared in 2.5/2.6 gave a key moved to a new consumer by a join to that consumer "
            "at once, while the consumer it came from still held earlier, unacked entries of "
            "it: two consumers processed the key at the same time and it arrived out of order "
            "(PIP-379's draining hashes are the fix)"
        ),
        recreated=(
            "DrainingHashesTracker.register_draining_hashes does nothing: a hash moved by a "
            "join or a leave never starts draining"
        ),
        expect=ORDER,
        install=_no_draining_registered,
    ),
    Fault(
        name="rolling-restart-redelivery",
        issues="apache/pulsar#23307 (PIP-282 classic; fixed by PIP-379, #23352)",
        dispatcher="classic",
        went_wrong=(
            "in a rolling restart, a consumer that reconnected under the same name got its "
            "hash ranges back and was sent a key's redelivered entries (a consumer leaving "
            "hands back what it held) while another consumer still held an earlier entry of "
            "that key, which then came after them; PIP-282's join rule does not cover "
            "redeliveries"
        ),
        recreated=(
            "ClassicKeySharedDispatcher._held_elsewhere always says no: our classic "
            "dispatcher's hold-back of hashes moved away from a consumer holding entries of them "
            "(beyond PIP-282) is gone"
        ),
        expect=ORDER,
        install=_no_moved_hash_hold_back,
    ),
    Fault(
        name="blind-to-requeues-during-read",
        issues="apache/pulsar#23870 (fixed by #23874; the same window as #12885, fixed by #12890)",
        dispatcher="any",
        went_wrong=(
            "PIP-379 in 4.0.0-4.0.2: while replay entries were being filtered and read, a "
            "draining hash got unblocked (an ack on another thread), so a later entry of the "
            "hash went out while an earlier one stayed queued (#12885 was the same with a "
            "consumer closing during a read). Ours is single-threaded, so nothing lands inside "
            "the filter; its window is the read in flight, during which a consumer leaving "
            "queues older entries of a hash the read carries newer ones of"
        ),
        recreated=(
            "ReplayQueue.min_added_with_hash and SharedDispatcher._min_replayed always read "
            "None: a completing read no longer sees that older entries were queued while it "
            "was in flight (either check alone covers most cases, so both go). The read path "
            "is the one both dispatchers share, and the simulation catches it mostly on "
            "classic seeds"
        ),
        expect=ORDER,
        install=_reads_blind_to_requeues,
    ),
    Fault(
        name="moved-back-counted-twice",
        issues="apache/pulsar#23845 (fixed by #24736)",
        dispatcher="pip379",
        went_wrong=(
            "PIP-379 in 4.0: a hash that moved away from a consumer holding entries of it, came "
            "back to it and moved away again (a consumer reconnecting under the same name) had "
            "its pending entries counted twice, so its count never reached zero: the hash "
            "stayed blocked, and the replay queue undelivered, until the old owner disconnected"
        ),
        recreated=(
            "DrainingHashesTracker.register_draining_hashes as in Pulsar 4.0: a hash that moved "
            "back to the consumer draining it is not cleared, and start_draining_hashes_for_"
            "consumer adds the consumer's pending entries to a surviving count instead of "
            "setting it"
        ),
        expect=STUCK,
        install=_draining_counted_twice,
    ),
)

BY_NAME = {f.name: f for f in ZOO}


def first_catch(fault: Fault, seeds: Iterable[int]) -> tuple[int, int, SimFailure] | None:
    """The first of ``seeds`` that catches ``fault``: (seed, how many seeds it took, failure)."""
    with fault.installed():
        for n, seed in enumerate(seeds, 1):
            try:
                run_seed(seed, trace=False)
            except SimFailure as failure:
                if fault.caught_by(failure):
                    return seed, n, failure
    return None


def catching_seeds(fault: Fault, seeds: Iterable[int]) -> list[int]:
    """Every one of ``seeds`` that catches ``fault``."""
    out = []
    with fault.installed():
        for seed in seeds:
            try:
                run_seed(seed, trace=False)
            except SimFailure as failure:
                if fault.caught_by(failure):
                    out.append(seed)
    return out


def survey(fault: Fault, total: int) -> tuple[int, list[int]]:
    """Of the first ``total`` seeds, those of the fault's dispatcher: how many there are, and
    the seeds to catch, i.e. the first catch's index (1-based) and the distance between each
    catch and the next (the seeds a run started just after one catch needs to reach the next)."""
    seeds = fault.seeds(0, total)
    caught = set(catching_seeds(fault, seeds))
    idx = [i for i, seed in enumerate(seeds, 1) if seed in caught]
    if not idx:
        return len(seeds), []
    return len(seeds), [idx[0]] + [b - a for a, b in pairwise(idx)]


def main(argv: list[str] | None = None) -> int:
    """List the zoo, replay a seed with a fault in, or survey the seeds each fault needs."""
    ap = argparse.ArgumentParser(prog="python -m tests.sim.zoo", description=__doc__.split("\n")[0])
    ap.add_argument("--fault", choices=sorted(BY_NAME), help="the fault to put in")
    ap.add_argument("--seed", type=int, help="replay this seed with --fault, traced")
    ap.add_argument("--survey", type=int, default=0, help="seeds to survey (of CI's first N)")
    args = ap.parse_args(argv)
    if args.fault and args.seed is not None:
        with BY_NAME[args.fault].installed():
            try:
                run_seed(args.seed)
            except SimFailure as failure:
                print(failure.render(trace_lines=10_000))
                return 1
        print(f"seed {args.seed} passes with {args.fault}")
        return 0
    if args.survey:
        for fault in ZOO if not args.fault else (BY_NAME[args.fault],):
            n, gaps = survey(fault, args.survey)
            med = statistics.median(gaps) if gaps else None
            print(
                f"{fault.name}: {len(gaps)} of {n} {fault.dispatcher} seeds catch it; seeds to "
                f"catch: first {gaps[0] if gaps else None}, median {med}, "
                f"worst {max(gaps) if gaps else None}"
            )
        return 0
    for fault in ZOO:
        print(f"{fault.name} [{fault.issues}] ({fault.dispatcher})\n  {fault.recreated}")
    print(f"CI runs {DEFAULT_SEEDS} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
