"""What the mutation scripts share: the modules in the order they run, and mutmut's results.

mutmut (3.x) keeps its work in ``./mutants``: a copy of ``src/`` and ``tests/`` in which every
mutated function is a trampoline choosing a variant by ``MUTANT_UNDER_TEST``, and per source file
a ``<file>.meta`` JSON with each mutant's exit code (``None`` until it ran). The scripts read those
files; they never write to ``src/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = ROOT / "mutants"
RESULTS = ROOT / "bench" / "results" / "mutation"

# Small modules first, then the dispatch code the simulator drives, then the rest of dispatch.
MODULES: tuple[str, ...] = (
    "keyshared.storage.range_set",
    "keyshared.broker.dedup_state",
    "keyshared.broker.dedup",
    "keyshared.broker.dispatch.draining",
    "keyshared.broker.dispatch.key_shared",
    "keyshared.broker.dispatch.key_shared_classic",
    "keyshared.broker.dispatch.shared",
    "keyshared.broker.dispatch.base",
    "keyshared.broker.dispatch.pending_acks",
    "keyshared.broker.dispatch.selectors",
    "keyshared.broker.dispatch.selectors.base",
    "keyshared.broker.dispatch.selectors.hashing",
    "keyshared.broker.dispatch.selectors.table",
    "keyshared.broker.dispatch.selectors.consistent",
    "keyshared.broker.dispatch.selectors.ranges",
    "keyshared.broker.dispatch.selectors.autosplit",
    "keyshared.broker.dispatch.selectors.exclusive",
    "keyshared.broker.dispatch.delayed",
    "keyshared.broker.dispatch.single_active",
    "keyshared.broker.dispatch.nonpersistent",
    "keyshared.broker.dispatch.unacked",
    "keyshared.storage.cursor_codec",
    "keyshared.storage.cursor_state",
    "keyshared.storage.cursor_persistence",
    "keyshared.storage.cursor_acks",
    "keyshared.storage.cursor_reads",
    "keyshared.storage.cursor_moves",
    "keyshared.storage.cursor_config",
    "keyshared.storage.cursor",
)

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into the report's columns.
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    37: "killed",  # by the type checker; not configured here
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
}


def status(code: int | None) -> str:
    """The report's word for a mutmut exit code."""
    if code is None:
        return "not run"
    return STATUS.get(code, "suspicious")


@dataclass(frozen=True, slots=True)
class Mutant:
    """One mutant and its result so far."""

    name: str
    module: str
    code: int | None
    duration: float | None

    @property
    def status(self) -> str:
        """killed, survived, timeout, no tests, not run, ..."""
        return status(self.code)


def source_path(module: str) -> Path:
    """``module``'s file under ``src/``, relative to the root: a package is its ``__init__.py``."""
    base = Path("src") / module.replace(".", "/")
    return base / "__init__.py" if (ROOT / base).is_dir() else base.with_suffix(".py")


def meta_path(module: str) -> Path:
    """Where mutmut keeps the results of ``module``."""
    return MUTANTS / (str(source_path(module)) + ".meta")


def load(module: str) -> list[Mutant]:
    """The mutants of ``module`` (empty before mutmut generated them)."""
    path = meta_path(module)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    durations = data.get("durations_by_key", {})
    return [
        Mutant(name, module, code, durations.get(name))
        for name, code in data["exit_code_by_key"].items()
    ]
