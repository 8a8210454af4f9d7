"""``keyshared admin``: pulsar-admin shaped commands over the admin REST API."""

from __future__ import annotations


def main(argv: list[str]) -> int:
    """Run ``keyshared admin`` with ``argv`` (imports typer only now)."""
    from keyshared.admin_cli.app import main as run

    return run(argv)
