"""CRC32C (Castagnoli), the checksum Pulsar puts after the 0x0E01 magic of payload frames.

It covers everything after the checksum field to the end of the frame: metadataSize, metadata
and payload. The ``crc32c`` package uses the CPU's CRC instructions where available.
"""

from __future__ import annotations

import crc32c as _crc32c

Bytes = bytes | bytearray | memoryview
"""Any contiguous byte buffer the codec accepts."""


def crc32c(data: Bytes, crc: int = 0) -> int:
    """CRC32C of ``data``; pass a previous result as ``crc`` to continue over several pieces.

    ``crc32c(b"123456789") == 0xE3069283``.
    """
    result: int = _crc32c.crc32c(data, crc)
    return result


def verify(data: Bytes, expected: int) -> bool:
    """Whether ``data`` has the CRC32C ``expected``."""
    return crc32c(data) == expected
