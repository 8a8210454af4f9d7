"""Who may join a Key_Shared subscription: a consumer asking for another mode or ordering is
refused with ConsumerBusy, overlapping STICKY ranges with ConsumerAssignError, and a refused
consumer is not left attached. The simulator only joins consumers that fit: each case kills
mutants that survived ``make mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

import pytest

from keyshared.broker.consumer import KeySharedMeta
from keyshared.broker.errors import BrokerError, ServerError
from tests.unit.mutation.ks_harness import Harness


@pytest.mark.parametrize(
    ("first", "second", "fits"),
    [
        (KeySharedMeta(), None, True),  # no meta: AUTO_SPLIT, in order
        (None, KeySharedMeta(), True),
        (None, None, True),
        (KeySharedMeta(), KeySharedMeta(allow_out_of_order_delivery=True), False),
        (KeySharedMeta(allow_out_of_order_delivery=True), KeySharedMeta(), False),
        (KeySharedMeta(allow_out_of_order_delivery=True), None, False),
        (
            KeySharedMeta(allow_out_of_order_delivery=True),
            KeySharedMeta(allow_out_of_order_delivery=True),
            True,
        ),
        (KeySharedMeta(), KeySharedMeta("STICKY", [(0, 10)]), False),
        (None, KeySharedMeta("STICKY", [(0, 10)]), False),
        (KeySharedMeta("STICKY", [(0, 10)]), KeySharedMeta("STICKY", [(11, 20)]), True),
        (KeySharedMeta("STICKY", [(0, 10)]), KeySharedMeta(), False),
        (KeySharedMeta("STICKY", [(0, 10)]), None, False),
    ],
)
def test_a_consumer_joins_only_with_the_subscriptions_mode_and_ordering(
    first: KeySharedMeta | None, second: KeySharedMeta | None, fits: bool
) -> None:
    h = Harness()
    try:
        c1 = h.join("c1", 0, meta=first, no_meta=first is None)
        d = h.dispatcher
        assert d.fits(c1)
        if fits:
            c2 = h.join("c2", 0, meta=second, no_meta=second is None)
            assert d.consumers == [c1, c2]
        else:
            with pytest.raises(BrokerError) as err:
                h.join("c2", 0, meta=second, no_meta=second is None)
            assert err.value.code is ServerError.ConsumerBusy
            assert err.value.message == (
                "Key_Shared subscription has a different key-shared mode or "
                "allowOutOfOrderDelivery setting"
            )
            assert d.consumers == [c1]
    finally:
        h.close()


def test_overlapping_sticky_ranges_are_refused_and_not_attached() -> None:
    h = Harness(mode="STICKY")
    try:
        c1 = h.join("c1", 0, meta=KeySharedMeta("STICKY", [(0, 100)]))
        with pytest.raises(BrokerError) as err:
            h.join("c2", 0, meta=KeySharedMeta("STICKY", [(50, 60)]))
        assert err.value.code is ServerError.ConsumerAssignError
        assert isinstance(err.value.message, str) and err.value.message  # the selector's reason
        d = h.dispatcher
        assert d.consumers == [c1]
        assert d.selector.select(55) is c1
        c3 = h.join("c3", 0, meta=KeySharedMeta("STICKY", [(101, 200)]))
        assert d.consumers == [c1, c3]
    finally:
        h.close()


def test_the_draining_tracker_names_its_subscription() -> None:
    # Its DrainingStateError names the dispatcher (Pulsar: "... in dispatcher <name>").
    h = Harness()
    try:
        h.join("c1", 0)
        draining = h.dispatcher.draining
        assert draining is not None and draining.name == "sub"
    finally:
        h.close()
