"""AUTO_SPLIT selector cases the property tests do not pin: each kills a mutant that survived
``make mutate`` (bench/results/mutation/report.md) in ``selectors/autosplit.py``."""

from __future__ import annotations

from dataclasses import dataclass

from keyshared.broker.dispatch.selectors import HashRangeAutoSplitStickyKeyConsumerSelector


@dataclass(eq=False)
class Consumer:
    """A consumer with identity semantics, as the selectors want."""

    consumer_name: str


def test_a_joiner_splits_the_biggest_range_even_after_a_leave_left_them_uneven() -> None:
    # Pulsar's findBiggestRange measures each range as its bound less the bound below and keeps
    # the first biggest; a leave hands the range to the consumer above, so sizes are uneven.
    selector = HashRangeAutoSplitStickyKeyConsumerSelector[Consumer]()
    c = {n: Consumer(n) for n in ("c1", "c2", "c3", "c4", "c5", "c6")}
    for n in ("c1", "c2", "c3", "c4", "c5"):
        selector.add_consumer(c[n])
    selector.remove_consumer(c["c4"])  # its (32768, 49152] goes to c1, the range above
    ranges = {k.consumer_name: v for k, v in selector.get_consumer_key_hash_ranges().items()}
    assert ranges == {
        "c5": [(0, 8192)],
        "c3": [(8193, 16384)],
        "c2": [(16385, 32768)],
        "c1": [(32769, 65536)],
    }
    # Sizes by bound: 8192, 8192, 16384, 32768: c1's range is the biggest, and c6 takes its
    # lower half.
    selector.add_consumer(c["c6"])
    ranges = {k.consumer_name: v for k, v in selector.get_consumer_key_hash_ranges().items()}
    assert ranges == {
        "c5": [(0, 8192)],
        "c3": [(8193, 16384)],
        "c2": [(16385, 32768)],
        "c6": [(32769, 49152)],
        "c1": [(49153, 65536)],
    }
