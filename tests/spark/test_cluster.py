"""A Spark standalone cluster on loopback (master + worker from the pyspark package's
``bin/spark-class``) runs the streaming copy with ``spark-submit --master spark://...``; the
driver is SIGKILLed mid-run, and the query finishes from its checkpoint in the local session:
exactly-once across a crashed cluster driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import BrokerProcess, free_port
from tests.spark.conftest import admin_path, jvm_env, produce
from tests.spark.stream_job import start_copy
from tests.spark.test_stream import check_exact_copy, read_topic

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {path}:\n" + path.read_text(errors="replace")[-3000:])


class Cluster:
    """A standalone master and one worker, both on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.root = root
        self.env = jvm_env(
            dict(
                os.environ,
                SPARK_HOME=str(self.home),
                SPARK_LOCAL_IP="127.0.0.1",
                PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable,
            )
        )
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _daemon(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, log

    def start(self) -> Cluster:
        master, mlog = self._daemon(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.ui)],
        )  # fmt: skip
        _wait_for(mlog, "I have been elected leader", master, 90)
        worker, wlog = self._daemon(
            "worker",
            ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
             "--memory", "2g", "--webui-port", str(free_port()),
             "--work-dir", str(self.root / "work"), self.url],
        )  # fmt: skip
        _wait_for(wlog, "Successfully registered with master", worker, 90)
        return self

    def state(self) -> Any:
        """The master's JSON status page."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c.start()
    finally:
        c.stop()


def test_cluster_job_killed_and_resumed(
    spark: Any,
    cluster: Cluster,
    dedup_broker: BrokerProcess,
    client_factory: Any,
    new_topic: Any,
    tmp_path: Path,
) -> None:
    broker = dedup_broker
    source, sink = new_topic("csrc"), new_topic("cdst")
    for t in (source, sink):
        assert broker.admin("PUT", admin_path(t) + "/partitions", 2)[0] == 204
    sent = produce(client_factory(broker), source, 1000, batching=False)
    checkpoint = str(tmp_path / "ckpt")
    args = [broker.service_url, broker.web_url, source, sink, checkpoint, "150"]
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [str(cluster.home / "bin" / "spark-submit"), "--master", cluster.url,
             "--total-executor-cores", "2", "--executor-memory", "1g",
             "--conf", "spark.ui.enabled=false",
             str(ROOT / "tests" / "spark" / "stream_job.py"), cluster.url, *args],
            cwd=ROOT, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        commits = Path(checkpoint) / "commits"
        deadline = time.monotonic() + 180
        while not (commits.exists() and len(list(commits.glob("[0-9]*"))) >= 2):
            assert driver.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.05)
        apps = cluster.state()["activeapps"]
        assert [a["name"] for a in apps] == ["stream-job"], apps
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(10)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert list((tmp_path / "work").glob("app-*/0/stderr")), "an executor ran on the worker"
    written = len(read_topic(spark, broker, sink))
    assert 0 < written < len(sent)

    query = start_copy(spark, args, available_now=True)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    check_exact_copy(read_topic(spark, broker, sink), sent)
