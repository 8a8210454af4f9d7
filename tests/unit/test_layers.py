"""The import rules of DESIGN.md's layers, checked on the source (imports inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "keyshared"


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (absolute names)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def sources(*parts: str) -> list[Path]:
    base = SRC.joinpath(*parts)
    return [base] if base.is_file() else sorted(base.rglob("*.py"))


@pytest.mark.parametrize(
    ("files", "forbidden"),
    [
        (sources("config.py"), ("keyshared.broker", "keyshared.server", "keyshared.admin")),
        (sources("storage"), ("keyshared.broker", "keyshared.server", "keyshared.admin")),
        (sources("protocol"), ("keyshared.broker", "keyshared.server", "keyshared.storage")),
        (sources("broker"), ("keyshared.server", "keyshared.admin")),
    ],
    ids=["config", "storage", "protocol", "broker"],
)
def test_imports_point_one_way(files: list[Path], forbidden: tuple[str, ...]) -> None:
    bad = [
        f"{f.relative_to(SRC)} imports {m}"
        for f in files
        for m in imported_modules(f)
        if m.startswith(forbidden)
    ]
    assert files and not bad, bad
