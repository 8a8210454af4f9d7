"""The ``keyshared`` command.

``standalone`` is parsed with argparse and imports nothing else first: the broker must accept
connections within half a second of the command starting, and the richer CLI libraries cost
a good part of that just to import.
"""

from __future__ import annotations

import argparse
import sys
import time


def _standalone(argv: list[str], started: float) -> int:
    parser = argparse.ArgumentParser(
        prog="keyshared standalone",
        description="Run a standalone broker with embedded storage.",
    )
    parser.add_argument("--data-dir", help="data directory (default ./data, key dataDir)")
    parser.add_argument("--broker-port", type=int, help="binary protocol port (default 6650)")
    parser.add_argument("--web-port", type=int, help="admin REST / metrics port (default 8080)")
    parser.add_argument("--config", help="broker.conf-style file of key=value lines")
    parser.add_argument("--bind-address", help="address to listen on (default 0.0.0.0)")
    args = parser.parse_args(argv)
    from keyshared.standalone import StandaloneOptions, run_standalone

    return run_standalone(
        StandaloneOptions(
            data_dir=args.data_dir,
            broker_port=args.broker_port,
            web_port=args.web_port,
            config_file=args.config,
            bind_address=args.bind_address,
        ),
        started,
    )


USAGE = """usage: keyshared COMMAND [ARGS]

commands:
  standalone   run a standalone broker (embedded storage)
  admin        administer a broker through its REST API (like `pulsar-admin`)
  client       produce and consume messages (like `pulsar-client`)
  perf         load generator: produce | consume with live rate and latency (like `pulsar-perf`)
  tokens       create keys and tokens for token authentication (like `pulsar tokens`)
  spark        Spark jobs on topics: audit | backlog | compact
  --version    print the version
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``keyshared`` script."""
    started = time.monotonic()
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] == "--version":
        from keyshared import __version__

        print(__version__)
        return 0
    if args[0] == "standalone":
        return _standalone(args[1:], started)
    if args[0] == "admin":
        from keyshared.admin_cli import main as admin_main

        return admin_main(args[1:])
    if args[0] == "client":
        from keyshared.admin_cli import plain_unless_help

        plain_unless_help(args[1:])
        from keyshared.cli_client import main as client_main

        return client_main(args[1:])
    if args[0] == "perf":
        from keyshared.perf import main as perf_main

        return perf_main(args[1:])
    if args[0] == "spark":
        from keyshared.spark.cli import main as spark_main

        return spark_main(args[1:])
    if args[0] == "tokens":
        from keyshared.tokens import main as tokens_main

        return tokens_main(args[1:])
    print(f"keyshared: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
