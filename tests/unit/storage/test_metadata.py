"""The SQLite metadata store."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from keyshared.storage.errors import StorageError
from keyshared.storage.metadata import MetadataStore


@pytest.fixture
def store(tmp_path: Path) -> MetadataStore:
    return MetadataStore(tmp_path / "meta.sqlite")


def test_get_put_delete(store: MetadataStore) -> None:
    assert store.get("topics/a") is None
    store.put("topics/a", b"1")
    assert store.get("topics/a") == b"1"
    store.put("topics/a", b"2")
    assert store.get("topics/a") == b"2"
    assert store.delete("topics/a") is True
    assert store.delete("topics/a") is False
    assert store.get("topics/a") is None


def test_binary_values_round_trip(store: MetadataStore) -> None:
    value = bytes(range(256)) * 3
    store.put("bin", value)
    assert store.get("bin") == value
    store.put("empty", b"")
    assert store.get("empty") == b""


def test_list_keys_by_prefix(store: MetadataStore) -> None:
    for key in ["cursors/t1/a", "cursors/t1/b", "cursors/t10/a", "cursors/t2/a", "topics/x"]:
        store.put(key, b"")
    store.put("cursors/t1/\U0001f600", b"")
    assert store.list_keys("cursors/t1/") == [
        "cursors/t1/a",
        "cursors/t1/b",
        "cursors/t1/\U0001f600",
    ]
    assert store.list_keys("cursors/t1") == [
        "cursors/t1/a",
        "cursors/t1/b",
        "cursors/t1/\U0001f600",
        "cursors/t10/a",
    ]
    assert store.list_keys("nothing/") == []
    assert len(store.list_keys()) == 6
    assert store.items("topics/") == [("topics/x", b"")]


def test_prefix_with_sql_wildcards_is_literal(store: MetadataStore) -> None:
    store.put("a%b/1", b"")
    store.put("axb/1", b"")
    store.put("a_b/1", b"")
    assert store.list_keys("a%b/") == ["a%b/1"]
    assert store.list_keys("a_b/") == ["a_b/1"]


def test_put_many_is_one_transaction(store: MetadataStore) -> None:
    store.put("old", b"x")
    store.put_many({"a": b"1", "b": b"2"}, deletes=["old"])
    assert store.get("a") == b"1"
    assert store.get("b") == b"2"
    assert store.get("old") is None
    store.put_many([("c", b"3")])
    assert store.get("c") == b"3"


def test_put_many_is_all_or_nothing(store: MetadataStore) -> None:
    store.put("a", b"before")
    with pytest.raises(StorageError):
        # A None value violates NOT NULL after the first row was written.
        store.put_many([("a", b"after"), ("b", None)])  # type: ignore[list-item]
    assert store.get("a") == b"before"
    assert store.get("b") is None


def test_delete_prefix(store: MetadataStore) -> None:
    for key in ["cursors/t/a", "cursors/t/b", "cursors/tt/a", "cursors/u/a"]:
        store.put(key, b"")
    assert store.delete_prefix("cursors/t/") == 2
    assert store.list_keys("cursors/") == ["cursors/tt/a", "cursors/u/a"]
    with pytest.raises(ValueError):
        store.delete_prefix("")


def test_json_helpers(store: MetadataStore) -> None:
    store.put_json("topics/t", {"partitions": 3, "name": "t"})
    assert store.get_json("topics/t") == {"partitions": 3, "name": "t"}
    assert store.get_json("missing") is None


def test_values_survive_reopen_and_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    store = MetadataStore(path)
    store.put("k", b"v")
    store.close()
    store = MetadataStore(path)
    assert store.get("k") == b"v"
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


@pytest.mark.parametrize(("durable", "level"), [(True, 2), (False, 1)])
def test_synchronous_level_follows_durability(tmp_path: Path, durable: bool, level: int) -> None:
    store = MetadataStore(tmp_path / "m.sqlite", durable=durable)
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == level
    store.close()


def test_closed_store_raises(store: MetadataStore) -> None:
    store.close()
    assert store.closed
    with pytest.raises(StorageError):
        store.get("k")
    store.close()


def test_safe_from_many_threads(store: MetadataStore) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(50):
                store.put(f"t{t}/{i}", b"%d" % i)
                assert store.get(f"t{t}/{i}") == b"%d" % i
            store.put_many([(f"t{t}/bulk{i}", b"") for i in range(10)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.list_keys()) == 4 * 60


def test_in_memory_store() -> None:
    store = MetadataStore(":memory:")
    store.put("a", b"b")
    assert store.get("a") == b"b"
    store.close()
