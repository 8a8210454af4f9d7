"""Message ids as the protocol carries them (``MessageIdData``), signed ids in, uint64 out."""

from __future__ import annotations

from collections.abc import Iterable

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.constants import UINT64_MASK
from keyshared.protocol.encode import to_int64


def message_id(
    ledger_id: int,
    entry_id: int,
    *,
    partition: int = -1,
    batch_index: int = -1,
    ack_set: Iterable[int] | None = None,
    batch_size: int | None = None,
) -> pb.MessageIdData:
    """A ``MessageIdData``; negative ledger/entry ids become uint64, -1 partition/index are left out."""
    mid = pb.MessageIdData(ledgerId=ledger_id & UINT64_MASK, entryId=entry_id & UINT64_MASK)
    if partition >= 0:
        mid.partition = partition
    if batch_index >= 0:
        mid.batch_index = batch_index
    if ack_set:
        mid.ack_set.extend(ack_set)
    if batch_size is not None:
        mid.batch_size = batch_size
    return mid


def position_of(mid: pb.MessageIdData) -> tuple[int, int]:
    """``(ledger_id, entry_id)`` of a message id, decoded as signed (uint64 max becomes -1)."""
    return to_int64(mid.ledgerId), to_int64(mid.entryId)


def copy_id(target: pb.MessageIdData, source: pb.MessageIdData) -> None:
    target.CopyFrom(source)
