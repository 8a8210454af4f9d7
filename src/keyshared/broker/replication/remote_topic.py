"""Before a replicator produces, the topic must exist on the remote cluster, shaped as here.

Pulsar's rule (``GeoPersistentReplicator.prepareCreateProducer`` with
``createTopicToRemoteClusterForReplication=true``, its default), through the remote cluster's
admin REST API (its ``serviceUrl``), whatever the remote's auto-creation policies:

* the partitions of the topic's base name are read on both sides (a 404 on the remote counts as
  0: no such topic);
* a non-partitioned topic here: created on the remote unless it exists there (409 is fine); a
  partitioned topic of that name there is a mismatch; credentials the remote refuses topic
  creation to (401/403) leave it to the producer's own request, as before;
* a partition here, of a topic of ``n`` partitions: the partitioned topic is created on the
  remote with ``n`` partitions when it is missing there; a different count there is a mismatch
  (as is an index the remote does not have after creation).

A mismatch is an error the replicator reports (``last_error``, the log) and retries after its
back-off, as Pulsar does: it never writes into a topic of another shape. With the setting
``false`` nothing is created here: the producer's own request decides, under the remote's
``allowAutoTopicCreation``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any

from keyshared.broker.client_credentials import ClientCredentials
from keyshared.broker.replication.client import RemoteError
from keyshared.broker.topic_name import TopicName

TIMEOUT = 10.0


def _auth_header(credentials: ClientCredentials) -> str | None:
    if credentials.method == "token":
        return "Bearer " + credentials.data.decode()
    if credentials.method == "basic":
        return "Basic " + base64.b64encode(credentials.data).decode()
    return None


def _call(
    admin_url: str,
    method: str,
    path: str,
    body: Any,
    credentials: ClientCredentials,
    context: ssl.SSLContext | None,
) -> tuple[int, Any]:
    # urllib.request (with http.client and the email parser) is imported on a remote call, not
    # with the broker: ~12 ms of a start-up whose target is 0.5 s to listening.
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(admin_url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    header = _auth_header(credentials)
    if header:
        req.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT, context=context) as resp:
            raw = resp.read()
            status = int(resp.status)
    except urllib.error.HTTPError as err:
        raw = err.read()
        status = int(err.code)
    except (OSError, ValueError) as exc:
        raise RemoteError(f"{admin_url}: {method} {path}: {exc!r}") from exc
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _rest_path(name: TopicName) -> str:
    return f"/admin/v2/{name.domain}/{name.tenant}/{name.namespace}/{name.local_name}"


def _reason(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("reason") or answer)
    return str(answer)


def ensure_remote_topic_sync(
    admin_url: str,
    topic: TopicName,
    local_partitions: int,
    credentials: ClientCredentials,
    context: ssl.SSLContext | None = None,
) -> None:
    """Make ``topic`` exist on the remote cluster at ``admin_url`` with the same shape as here
    (``local_partitions``: of its partitioned base, 0 when not partitioned); raises
    :class:`RemoteError` when it cannot (see the module docstring)."""
    index = topic.partition_index
    base = topic.partitioned_base if index >= 0 else topic

    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return _call(admin_url, method, path, body, credentials, context)

    def remote_partitions() -> int:
        status, answer = call("GET", _rest_path(base) + "/partitions")
        if status == 404:
            return 0
        if status != 200 or not isinstance(answer, dict):
            raise RemoteError(f"{admin_url}: partitions of {base.full}: {status} {answer!r}")
        return int(answer.get("partitions") or 0)

    remote = remote_partitions()
    if local_partitions == 0:
        if remote != 0:
            raise RemoteError(
                "Topic type is not matched between local and remote cluster: local "
                f"partitions: 0, remote partitions: {remote}"
            )
        status, answer = call("PUT", _rest_path(topic))
        if status in (401, 403):
            # Credentials that may produce but not create topics through the admin API (this
            # broker asks a tenant admin for that): the producer's own request creates it,
            # under the remote's allowAutoTopicCreation, as before this check existed.
            return
        if status not in (200, 204, 409):
            raise RemoteError(f"{admin_url}: creating {topic.full}: {status} {_reason(answer)}")
        return
    if remote == 0:
        status, answer = call("PUT", _rest_path(base) + "/partitions", local_partitions)
        if status not in (200, 204, 409):
            raise RemoteError(
                f"{admin_url}: creating partitioned {base.full}: {status} {_reason(answer)}"
            )
        remote = remote_partitions()
        if index >= remote:
            raise RemoteError(
                "Topic type is not matched between local and remote cluster: local "
                f"partitions: {local_partitions}, remote partitions: {remote}"
            )
    elif remote != local_partitions:
        raise RemoteError(
            "The number of topic partitions is inconsistent between local and remote "
            f"clusters: local partitions: {local_partitions}, remote partitions: {remote}"
        )


async def ensure_remote_topic(
    admin_url: str,
    topic: TopicName,
    local_partitions: int,
    credentials: ClientCredentials,
    context: ssl.SSLContext | None = None,
) -> None:
    """:func:`ensure_remote_topic_sync` in a worker thread (blocking HTTP off the loop)."""
    await asyncio.to_thread(
        ensure_remote_topic_sync, admin_url, topic, local_partitions, credentials, context
    )
