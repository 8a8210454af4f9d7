"""The `keyshared` command routes each subcommand to its module."""

from __future__ import annotations

import pytest

from keyshared.cli import main


@pytest.mark.parametrize("command", ["admin", "client", "perf", "tokens", "spark"])
def test_subcommands_answer_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([command, "--help"])
    except SystemExit as exc:  # argparse-based subcommands exit from --help
        code = exc.code
    assert code == 0
    out = capsys.readouterr().out
    assert "usage" in out.lower()


def test_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err
