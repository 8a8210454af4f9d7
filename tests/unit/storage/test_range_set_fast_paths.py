"""The range set's fast paths for one-byte deltas give exactly the bytes (and boundaries) of the
general varint path, whatever the deltas and magnitudes."""

from __future__ import annotations

import random
from itertools import chain, islice
from operator import sub

import pytest

from keyshared.storage import range_set
from keyshared.storage.cursor_codec import CursorCodecError, encode_uvarints
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet


def general(b: list[int], k: int) -> bytes:
    stop = 2 * k
    return encode_uvarints(chain((k, b[0]), map(sub, islice(b, 1, stop), islice(b, 0, stop - 1))))


def boundaries(rnd: random.Random, n: int, max_gap: int, start_bits: int) -> list[int]:
    x = rnd.randrange(0, 2**start_bits)
    out = []
    for _ in range(2 * n):
        x += rnd.randrange(1, max_gap + 1) if max_gap > 1 else 1
        out.append(x)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_encode_matches_the_general_path(seed: int) -> None:
    rnd = random.Random(seed)
    fast = 0
    for _ in range(600):
        n = rnd.choice([31, 32, 33, 64, 500])
        gap = rnd.choice([1, 2, 127, 128, 129, 255, 256, 257, 2**20, 2**40])
        b = boundaries(rnd, n, gap, rnd.choice([0, 7, 30, 31, 32, 40, 60]))
        if b[-1] >= 2**63:
            continue
        k = rnd.randrange(1, n + 1)
        block = range_set._encode_ledger(b, k)
        assert block == general(b, k)
        fast += range_set._small_deltas(b, 2 * k) is not None
        if k == n:
            assert range_set._decode_ledger(block) == b
    assert fast > 0


def test_boundaries_straddling_int32() -> None:
    b = [2**31 - 200 + 2 * i for i in range(200)]
    assert range_set._small_deltas(b, 200) is not None
    assert range_set._encode_ledger(b, 100) == general(b, 100)
    assert range_set._decode_ledger(general(b, 100)) == b


def test_zero_delta_is_corrupt() -> None:
    block = bytearray(general(list(range(1, 201)), 100))
    block[-1] = 0
    with pytest.raises(CursorCodecError):
        range_set._decode_ledger(bytes(block))


def test_a_million_holes_round_trip() -> None:
    rs = RangeSet()
    for e in range(1, 200_000, 2):
        rs.add(Position(7, e))
    data = rs.to_bytes()
    back = RangeSet.from_bytes(data)
    assert len(back) == len(rs) == 100_000
    assert back.to_bytes() == data
    assert Position(7, 3) in back and Position(7, 4) not in back
