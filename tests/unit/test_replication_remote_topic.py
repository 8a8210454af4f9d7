"""The replicator's remote topic creation, against a stub admin API: what it asks, what it
creates, what it refuses (Pulsar's ``prepareCreateProducer`` matrix)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from keyshared.broker.client_credentials import NO_CREDENTIALS, ClientCredentials
from keyshared.broker.replication.client import RemoteError
from keyshared.broker.replication.remote_topic import ensure_remote_topic_sync
from keyshared.broker.topic_name import TopicName

BASE = "/admin/v2/persistent/t/ns/x"


class Stub:
    """A remote admin API: ``partitions`` of ``t/ns/x`` (None: 404), the status PUT answers."""

    def __init__(self) -> None:
        self.partitions: int | None = None
        self.put_status = 204
        self.calls: list[tuple[str, str, Any, str]] = []


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: Any = None) -> None:
            raw = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            state.calls.append(("GET", self.path, None, self.headers.get("Authorization", "")))
            if state.partitions is None:
                self._answer(404, {"reason": "Topic not found"})
            else:
                self._answer(200, {"partitions": state.partitions})

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            state.calls.append(("PUT", self.path, body, self.headers.get("Authorization", "")))
            if state.put_status == 204 and self.path.endswith("/partitions"):
                state.partitions = int(body)
            self._answer(state.put_status)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _ensure(
    url: str, topic: str, partitions: int, creds: ClientCredentials = NO_CREDENTIALS
) -> None:
    ensure_remote_topic_sync(url, TopicName.parse(topic), partitions, creds)


def test_a_missing_partitioned_topic_is_created_with_the_same_partitions(
    stub: tuple[Stub, str],
) -> None:
    state, url = stub
    _ensure(url, "persistent://t/ns/x-partition-2", 3, ClientCredentials("token", b"tok"))
    assert state.calls == [
        ("GET", BASE + "/partitions", None, "Bearer tok"),
        ("PUT", BASE + "/partitions", 3, "Bearer tok"),
        ("GET", BASE + "/partitions", None, "Bearer tok"),
    ]


def test_an_existing_partitioned_topic_of_the_same_size_is_left_alone(
    stub: tuple[Stub, str],
) -> None:
    state, url = stub
    state.partitions = 3
    _ensure(url, "persistent://t/ns/x-partition-0", 3)
    assert [c[0] for c in state.calls] == ["GET"]


@pytest.mark.parametrize(
    ("remote", "topic", "local", "why"),
    [
        (2, "persistent://t/ns/x-partition-0", 3, "number of topic partitions is inconsistent"),
        (2, "persistent://t/ns/x", 0, "Topic type is not matched"),
    ],
)
def test_another_shape_on_the_remote_is_refused(
    stub: tuple[Stub, str], remote: int, topic: str, local: int, why: str
) -> None:
    state, url = stub
    state.partitions = remote
    with pytest.raises(RemoteError, match=why):
        _ensure(url, topic, local)
    assert [c[0] for c in state.calls] == ["GET"]


def test_a_non_partitioned_topic_is_created_and_409_is_fine(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.partitions = 0
    state.put_status = 409
    _ensure(url, "persistent://t/ns/x", 0)
    assert state.calls[-1][:2] == ("PUT", BASE)


def test_credentials_without_the_right_to_create_leave_it_to_the_producer(
    stub: tuple[Stub, str],
) -> None:
    state, url = stub
    state.partitions = 0
    state.put_status = 403
    _ensure(url, "persistent://t/ns/x", 0)  # no error: the producer's request decides
    state.put_status = 500
    with pytest.raises(RemoteError, match="500"):
        _ensure(url, "persistent://t/ns/x", 0)


def test_an_unreachable_admin_api_is_an_error_to_retry() -> None:
    with pytest.raises(RemoteError):
        _ensure("http://127.0.0.1:1", "persistent://t/ns/x", 0)
