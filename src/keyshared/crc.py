"""The ``crc32c`` package's C function, loaded without the package's ``__init__``.

``import crc32c`` runs ``importlib.metadata`` (for ``__version__``) and the package's CLI
module (argparse, mmap, the email parser through the metadata): about 35 ms of a broker start
whose target is 0.5 s to listening, for nothing the broker uses. The extension module itself
loads in under a millisecond, so it is loaded directly from the installed package's directory;
if that ever fails (a different layout, a zip install), the ordinary import is the fallback.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

Buffer = bytes | bytearray | memoryview


def _load() -> Any:
    loaded = sys.modules.get("crc32c._crc32c")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("crc32c")
    if spec is not None and spec.submodule_search_locations:
        for directory in spec.submodule_search_locations:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = f"{directory}/_crc32c{suffix}"
                ext = importlib.util.spec_from_file_location("crc32c._crc32c", path)
                if ext is None or ext.loader is None:
                    continue
                try:
                    module = importlib.util.module_from_spec(ext)
                    ext.loader.exec_module(module)
                except (ImportError, OSError):
                    continue
                return module
    import crc32c._crc32c as fallback  # pragma: no cover - only when the direct load fails

    return fallback  # pragma: no cover


crc32c: Callable[..., int] = _load().crc32c
"""CRC32C (Castagnoli) of a buffer, continuing from ``crc`` (0 to start): ``crc32c(data, crc)``."""
