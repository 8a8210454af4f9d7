"""The producer simulation's oracle can fail: plant a known-bad rule, and a seed must break
within :data:`BUDGET` seeds (fixed seeds: deterministic)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest

from keyshared.broker.dedup import DUPLICATE, Decision, Deduplication, DedupState
from keyshared.broker.sequence_ids import SendIds
from keyshared.server.publish import Answer, ReceiptQueue
from tests.sim.producers import Client, ProducerSimFailure, SimTopic, run_producer_seed

BUDGET = 50


def first_failure(expect: str, budget: int = BUDGET) -> ProducerSimFailure:
    """The first of ``budget`` seeds failing with ``expect`` in its message."""
    seen: list[str] = []
    for seed in range(budget):
        try:
            run_producer_seed(seed, trace=False)
        except ProducerSimFailure as failure:
            if expect in failure.message:
                return failure
            seen.append(failure.message)
    raise AssertionError(f"no seed of {budget} broke {expect!r}; other failures: {seen[:5]}")


def test_pulsars_highest_sequence_id_rule_loses_key_based_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pulsar's MessageDeduplication: a send whose sequence id is at or below the highest one
    # pushed is a duplicate. A key-based batch sent after another key's higher ids is dropped.
    exact = DedupState.check

    def highest_rule(self: DedupState[Hashable], name: str, send: SendIds) -> Decision[Any]:
        st = self.producers.get(name)
        if st is not None:
            pushed = max([st.highest, *st.in_flight])
            if send.first <= pushed:
                return Decision(DUPLICATE, None)
        return exact(self, name, send)

    monkeypatch.setattr(DedupState, "check", highest_rule)
    failure = first_failure("confirmed")
    assert "not stored" in failure.message
    assert "replay: SIM_SEED=" in str(failure)


def at_once(self: ReceiptQueue, slot: Answer, emit: Callable[[Answer], None]) -> None:
    """A receipt queue that lets each answer out as soon as it is known."""
    slot.ready = True
    self._slots.remove(slot)
    emit(slot)


def test_answering_duplicates_at_once_breaks_receipt_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A receipt queue that lets each answer out as soon as it is known: a duplicate's receipt
    # overtakes the receipt of an earlier send still being written.
    monkeypatch.setattr(ReceiptQueue, "resolve", at_once)
    first_failure("receipt order")


def test_recovery_without_the_replay_stores_resends_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Recovery that loads the snapshot but skips the entries written after it.
    async def snapshot_only(self: Deduplication) -> None:
        snap: Any = self.metadata.get_json(self.key)
        if snap:
            self.state.load_json(snap.get("producers", {}))

    monkeypatch.setattr(Deduplication, "recover", snapshot_only)
    first_failure("stored twice")


def test_forgetting_a_failed_write_late_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A failed write left marked in flight: its resend waits on it, gets its error again, and
    # the producer never gets through.
    monkeypatch.setattr(DedupState, "failed", lambda self, name, send, token: None)
    first_failure("did not come to rest")


def test_a_failing_seed_replays_to_the_same_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReceiptQueue, "resolve", at_once)
    failure = first_failure("receipt order")
    with pytest.raises(ProducerSimFailure) as again:
        run_producer_seed(failure.seed, trace=False)
    assert (again.value.step, again.value.message) == (failure.step, failure.message)
    traced = [run_producer_seed_trace(failure.seed) for _ in range(2)]
    assert traced[0] == traced[1] and len(traced[0]) > 10


def run_producer_seed_trace(seed: int) -> list[str]:
    """The trace of a failing seed."""
    with pytest.raises(ProducerSimFailure) as failed:
        run_producer_seed(seed, trace=True)
    return failed.value.trace


def test_a_snapshot_covering_failed_writes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Covering failed writes too: a snapshot then names a position past the log's end, and
    # recovery distrusts it and replays the whole log.
    def covers_failures(self: Deduplication, position: Any, stored: bool) -> None:
        out = self._outstanding
        if position in out:
            out[position] = stored
        while out:
            first, ended = next(iter(out.items()))
            if ended is None:
                break
            del out[first]
            self._covered = first

    monkeypatch.setattr(Deduplication, "_ended", covers_failures)
    first_failure("not in the log")


def test_forgetting_a_connected_producers_name_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A name that stays idle from its first disconnect, reconnects notwithstanding.
    monkeypatch.setattr(DedupState, "producer_added", lambda self, name: self.connected.add(name))
    first_failure("forgotten while its producer is connected")


def test_forgetting_a_name_with_writes_in_flight_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DedupState, "_writing", lambda self, name: False)
    first_failure("stored twice", budget=200)


def test_the_cpp_clients_counter_reset_loses_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the C++ client does (apache/pulsar#2047 fixed it in Java only): reconnecting before
    # its first receipt, it restarts its counter at the broker's last_sequence_id + 1 although
    # sends with higher ids are pending; new messages reuse their ids and are taken for
    # duplicates. No broker rule can tell them apart: the model must notice (as a message
    # stored twice or a receipt for an entry that does not hold it: the reused ids make two
    # messages one to the model too).
    connect = Client.connect

    def resetting(self: Client, topic: SimTopic) -> None:
        if self.receipts == 0 and topic.held is None:
            self.next_seq = topic.dedup.last_sequence_id(self.name) + 1
        connect(self, topic)

    monkeypatch.setattr(Client, "connect", resetting)
    first_failure("")
