"""``keyshared admin``: pulsar-admin shaped commands over the admin REST API."""

from __future__ import annotations

import os


def plain_unless_help(argv: list[str]) -> None:
    """Use rich (typer's pretty help) only when help is asked for: importing it costs more
    than most admin calls take, and plain usage errors suit scripts better."""
    if argv and not {"--help", "-h"} & set(argv):
        os.environ.setdefault("TYPER_USE_RICH", "0")


def main(argv: list[str]) -> int:
    """Run ``keyshared admin`` with ``argv`` (imports typer only now)."""
    plain_unless_help(argv)
    from keyshared.admin_cli.app import main as run

    return run(argv)
