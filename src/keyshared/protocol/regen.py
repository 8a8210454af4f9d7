"""Regenerate the committed protobuf module from ``pulsar_api.proto``.

``python -m keyshared.protocol.regen`` rewrites ``pulsar_api_pb2.py`` and ``pulsar_api_pb2.pyi``
next to the ``.proto``; ``--check`` regenerates into a temporary directory and exits with status 1
if the committed files differ; ``--out DIR`` writes the files into ``DIR`` instead.

protoc comes from ``grpcio-tools`` (a dev dependency), run as a subprocess so that nothing at
runtime imports it. Its output depends on the protoc version bundled with ``grpcio-tools``, which
is why the committed files carry that version and a unit test compares them byte for byte.

protoc's stub writes bare ``Mapping`` in constructor signatures, which ``mypy --strict`` rejects
(``type-arg``); :func:`generate` prepends an inline mypy directive that silences exactly that code
for the stub, so the project's mypy configuration needs no special case for it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
"""Directory holding the ``.proto`` source and the committed generated module."""

PROTO_NAME = "pulsar_api.proto"
"""File name of the protocol schema, relative to :data:`PROTO_DIR`."""

GENERATED_NAMES = ("pulsar_api_pb2.py", "pulsar_api_pb2.pyi")
"""The files protoc writes for :data:`PROTO_NAME`."""

STUB_HEADER = '# mypy: disable-error-code="type-arg"\n'
"""Prepended to the generated stub (see the module docstring)."""


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the schema, writing the generated module and stub into ``out_dir``.

    Returns the paths of the generated files. Raises ``RuntimeError`` if protoc fails.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        PROTO_NAME,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=PROTO_DIR)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed ({proc.returncode}): {proc.stderr.strip()}")
    stub = out_dir / GENERATED_NAMES[1]
    stub.write_text(STUB_HEADER + stub.read_text(encoding="utf-8"), encoding="utf-8")
    return [out_dir / name for name in GENERATED_NAMES]


def stale_files(committed_dir: Path = PROTO_DIR) -> list[str]:
    """Regenerate into a temporary directory and list the committed files that differ.

    An empty list means the committed module matches the schema and the installed protoc.
    """
    with tempfile.TemporaryDirectory(prefix="keyshared-regen-") as tmp:
        fresh = generate(Path(tmp))
        return [
            path.name
            for path in fresh
            if not (committed_dir / path.name).is_file()
            or (committed_dir / path.name).read_bytes() != path.read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m keyshared.protocol.regen", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--check", action="store_true", help="exit 1 if the committed files are out of date"
    )
    group.add_argument("--out", type=Path, help="write the generated files into this directory")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"out of date: {', '.join(stale)}; run python -m keyshared.protocol.regen")
            return 1
        print("generated protocol module is up to date")
        return 0
    written = generate(args.out if args.out is not None else PROTO_DIR)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
