"""``keyshared spark audit | backlog | compact``: the ready-made Spark jobs from the shell.

Exit status: 0 on success; ``audit`` exits 1 when it finds a problem; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keyshared spark", description=__doc__)
    sub = p.add_subparsers(dest="job", required=True)

    def common(sp: argparse.ArgumentParser, *, admin_required: bool = False) -> None:
        sp.add_argument(
            "--master", help="Spark master (default local[*], or $KEYSHARED_SPARK_MASTER)"
        )
        sp.add_argument("--service-url", default="pulsar://127.0.0.1:6650", help="broker URL")
        sp.add_argument(
            "--admin-url",
            default=None if not admin_required else "http://127.0.0.1:8080",
            help="admin REST URL (http://host:8080)",
        )
        sp.add_argument("--json", action="store_true", help="print JSON instead of text")

    a = sub.add_parser("audit", help="audit Key_Shared consumption logs against the topic")
    common(a)
    a.add_argument("--logs", nargs="+", required=True, help="consumption log files/dirs/globs")
    a.add_argument("--topic", help="the consumed topic (enables the loss check)")
    a.add_argument("--subscription", help="only this subscription")
    a.add_argument("--no-spark", action="store_true", help="audit in plain Python (small logs)")

    b = sub.add_parser("backlog", help="unacknowledged messages per subscription, by key and age")
    common(b, admin_required=True)
    b.add_argument("--topic", required=True)
    b.add_argument("--subscription", action="append", help="repeatable; default: all")
    b.add_argument("--top", type=int, default=20, help="keys to list per subscription")

    c = sub.add_parser("compact", help="latest value per key into Parquet and/or a topic")
    common(c)
    c.add_argument("--topic", required=True)
    c.add_argument("--parquet", help="output directory (overwritten)")
    c.add_argument("--output-topic", help="output topic")
    return p


def _print(obj: Any, as_json: bool, text: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if as_json else text)


def main(argv: list[str]) -> int:
    """Run one job; ``argv`` excludes ``keyshared spark``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.job == "audit":
        return _audit(args)
    if args.job == "backlog":
        return _backlog(args)
    return _compact(args)


def _topic_df(spark: Any, args: argparse.Namespace) -> Any:
    reader = (
        spark.read.format("keyshared")
        .option("service.url", args.service_url)
        .option("topic", args.topic)
    )
    if args.admin_url:
        reader = reader.option("admin.url", args.admin_url)
    return reader.load()


def _audit(args: argparse.Namespace) -> int:
    from keyshared.spark.audit import audit, audit_events

    if args.no_spark:
        import glob
        from pathlib import Path

        from keyshared.spark.consumption_log import read_events

        files: list[str | Path] = []
        for spec in args.logs:
            p = Path(spec)
            files.extend(sorted(p.glob("*")) if p.is_dir() else sorted(glob.glob(spec)))
        ids = None
        if args.topic:
            from keyshared.spark.session import get_session

            spark = get_session(args.master, "keyshared-audit")
            ids = [
                (r[0], r[1], r[2], r[3])
                for r in _topic_df(spark, args)
                .select("__topic", "__ledgerId", "__entryId", "__batchIndex")
                .collect()
            ]
        report = audit_events(read_events(files), ids, subscription=args.subscription)
    else:
        from keyshared.spark.session import get_session

        spark = get_session(args.master, "keyshared-audit")
        topic_df = _topic_df(spark, args) if args.topic else None
        report = audit(spark, args.logs, topic_df=topic_df, subscription=args.subscription)
    _print(report.to_dict(), args.json, report.summary())
    return 0 if report.ok else 1


def _backlog(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from keyshared.spark.backlog import backlog
    from keyshared.spark.session import get_session

    spark = get_session(args.master, "keyshared-backlog")
    result = backlog(
        spark, args.service_url, args.admin_url, args.topic, args.subscription, top_keys=args.top
    )
    lines = []
    for b in result:
        oldest = "-" if b.oldest_age_s is None else f"{b.oldest_age_s:.1f}s"
        lines.append(f"{b.subscription}: {b.messages} unacked, {b.keys} keys, oldest {oldest}")
        lines.append("  by age: " + ", ".join(f"{k} {v}" for k, v in b.by_age.items()))
        for row in b.by_key:
            lines.append(
                f"  key {row['key']!r}: {row['messages']} (oldest {row['oldest_age_s']:.1f}s)"
            )
    _print([asdict(b) for b in result], args.json, "\n".join(lines) or "no subscriptions")
    return 0


def _compact(args: argparse.Namespace) -> int:
    from keyshared.spark.compact import compact
    from keyshared.spark.session import get_session

    if not args.parquet and not args.output_topic:
        print("keyshared spark compact: give --parquet and/or --output-topic", file=sys.stderr)
        return 2
    spark = get_session(args.master, "keyshared-compact")
    n = compact(
        spark,
        args.service_url,
        args.topic,
        admin_url=args.admin_url,
        parquet=args.parquet,
        output_topic=args.output_topic,
    )
    _print({"keys": n}, args.json, f"compacted {args.topic}: {n} live keys")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
