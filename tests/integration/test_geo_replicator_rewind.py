"""The replicator's rewind under the cursor's read epoch, against a real remote broker.

The replicator runs in this process over a cursor whose ledger reads complete only when the
test says (``storage.memory.ControlledReader``); the remote is a real broker process. A read is
left in flight when the remote closes the replicator's producer (an unload): the replicator
rewinds and starts again, and the old read, completed afterwards, must not move the read position
(seed issue-20277: it was issued in the old epoch). Were it to, the entries it covered would be
skipped and never reach the remote. About 5 s on ``-n 0``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pulsar
import pytest

from keyshared.broker.client_credentials import NO_CREDENTIALS
from keyshared.broker.replication.decisions import Backoff
from keyshared.broker.replication.replicator import Replicator
from keyshared.protocol import encode_payload_section, pb
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.memory import ControlledReader, InMemoryLedger
from keyshared.storage.position import EARLIEST
from tests.broker_process import BrokerProcess, quiet_logger
from tests.integration.admin_support import ok

pytestmark = pytest.mark.integration


def _entry(i: int) -> bytes:
    md = pb.MessageMetadata(
        producer_name="app", sequence_id=i, publish_time=int(time.time() * 1000)
    )
    return encode_payload_section(md, f"m{i}".encode())


async def _until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_read_in_flight_at_a_failure_never_skips_entries(
    fresh_broker: BrokerProcess, unique: Callable[[str], str]
) -> None:
    b = fresh_broker.start()
    topic = f"persistent://public/default/{unique('rewind')}"
    client = pulsar.Client(b.service_url, logger=quiet_logger())
    try:
        client.subscribe(topic, "audit").close()
    finally:
        client.close()
    ledger = InMemoryLedger()
    reader = ControlledReader(ledger)
    cursor = ManagedCursor("pulsar.repl.remote", reader, durable=False, initial_position=EARLIEST)

    async def scenario() -> Replicator:
        rep = Replicator(
            topic=topic,
            local="local",
            remote="remote",
            cursor=cursor,
            target=lambda: (b.service_url, NO_CREDENTIALS),
            backoff=Backoff(0.05, 0.05),
        )
        for i in range(5):
            ledger.add_entry(_entry(i))
        rep.start()
        await _until(lambda: bool(reader.pending_reads))
        reader.complete_all()
        await _until(lambda: cursor.mark_delete_position == ledger.last_add_confirmed)
        for i in range(5, 10):
            ledger.add_entry(_entry(i))
        await _until(lambda: bool(reader.pending_reads))
        stale = len(reader.pending_reads)
        # The remote closes the replicator's producer while that read is in flight.
        path = f"/admin/v2/persistent/{topic[len('persistent://') :]}/unload"
        await asyncio.to_thread(ok, b, "PUT", path)
        await _until(lambda: rep.sessions == 2 and len(reader.pending_reads) > stale)
        # The old read completes after the rewind: stale, it moves nothing.
        reader.complete(0)
        reader.complete_all()
        await _until(lambda: cursor.mark_delete_position == ledger.last_add_confirmed)
        await rep.stop()
        return rep

    rep = asyncio.run(scenario())
    assert rep.msg_out_counter == 10
    client = pulsar.Client(b.service_url, logger=quiet_logger())
    try:
        consumer = client.subscribe(topic, "audit")
        got = [consumer.receive(timeout_millis=5000).data() for _ in range(10)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        client.close()
    assert got == [f"m{i}".encode() for i in range(10)]
