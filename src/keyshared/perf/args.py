"""keyshared perf's command line, with pulsar-perf's option names."""

from __future__ import annotations

import argparse


def add_common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("topics", nargs="+", metavar="TOPIC", help="persistent://tenant/ns/topic")
    p.add_argument("-u", "--service-url", default="pulsar://localhost:6650", help="broker URL")
    p.add_argument("-t", "--num-topic", dest="num_topics", type=int, default=1, help="topics")
    p.add_argument("--separator", default="-", help="between the topic and its number")
    p.add_argument(
        "-m", "--num-messages", type=int, default=0, help="messages in total (0: no limit)"
    )
    p.add_argument("-time", "--test-duration", type=float, default=0, help="seconds (0: no limit)")
    p.add_argument(
        "-i",
        "--stats-interval-seconds",
        type=float,
        default=0,
        help="seconds between live lines (default 1 on a terminal, 10 otherwise)",
    )
    p.add_argument("--auth-plugin", default="", help="e.g. AuthenticationToken")
    p.add_argument("--auth-params", default="", help="token:<jwt> or file:///path/to/token")
    p.add_argument("--trust-cert-file", default="", help="CA bundle for pulsar+ssl://")
    p.add_argument("--tls-allow-insecure", action="store_true", help="skip TLS verification")
    p.add_argument("-ioThreads", "--num-io-threads", type=int, default=1, help="client IO threads")
    p.add_argument(
        "--json-out", metavar="FILE", help="write the summary as JSON to FILE ('-': stdout)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``keyshared perf`` parser."""
    parser = argparse.ArgumentParser(
        prog="keyshared perf", description="Load generator shaped like pulsar-perf."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce", help="publish at a rate and measure publish latency")
    add_common_options(p)
    p.add_argument("-r", "--rate", type=float, default=100, help="msg/s across topics (0: max)")
    p.add_argument("-s", "--size", type=int, default=1024, help="message size in bytes")
    p.add_argument("-n", "--num-producers", type=int, default=1, help="producers per topic")
    p.add_argument("-pn", "--producer-name", default=None, help="producer name (one producer)")
    p.add_argument(
        "-o", "--max-outstanding", type=int, default=1000, help="messages in flight at most"
    )
    p.add_argument(
        "-b",
        "--batch-time-window",
        type=float,
        default=1.0,
        help="batch messages for this many ms (0: no batching)",
    )
    p.add_argument("-db", "--disable-batching", action="store_true", help="no batching")
    p.add_argument("-bm", "--batch-max-messages", type=int, default=1000, help="per batch")
    p.add_argument(
        "-bb", "--batch-max-bytes", type=int, default=4 * 1024 * 1024, help="bytes per batch"
    )
    p.add_argument(
        "-z",
        "--compression",
        default="NONE",
        choices=["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"],
        type=str.upper,
    )
    p.add_argument(
        "-mk",
        "--message-key-generation-mode",
        choices=["autoIncrement", "random"],
        default=None,
        help="give each message a key",
    )
    p.add_argument(
        "-nk",
        "--num-keys",
        type=int,
        default=0,
        help="with -mk: draw keys from this many (0: unbounded)",
    )
    p.add_argument("-f", "--payload-file", help="payloads: lines of this file, chosen at random")
    p.add_argument("-d", "--delay", type=float, default=0, help="deliver after this many seconds")
    p.add_argument("--send-timeout", type=int, default=0, help="send timeout ms (0: none)")
    p.add_argument("-ef", "--exit-on-failure", action="store_true", help="stop at a failure")

    c = sub.add_parser("consume", help="subscribe and measure end-to-end latency")
    add_common_options(c)
    c.add_argument("-s", "--subscriber-name", default="sub", help="subscription name prefix")
    c.add_argument("-ss", "--subscriptions", nargs="*", default=None, help="subscription names")
    c.add_argument("-ns", "--num-subscriptions", type=int, default=1, help="per topic")
    c.add_argument("-n", "--num-consumers", type=int, default=1, help="per subscription")
    c.add_argument(
        "-st",
        "--subscription-type",
        default="Exclusive",
        choices=["Exclusive", "Shared", "Failover", "Key_Shared"],
    )
    c.add_argument(
        "-sp",
        "--subscription-position",
        default="Latest",
        choices=["Latest", "Earliest"],
    )
    c.add_argument("-r", "--rate", type=float, default=0, help="msg/s at most (0: no limit)")
    c.add_argument("-q", "--receiver-queue-size", type=int, default=1000)
    c.add_argument("--acks-delay-millis", type=int, default=100, help="(accepted, unused)")
    return parser
