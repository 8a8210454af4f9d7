"""CRC32C (Castagnoli), the checksum Pulsar puts after the 0x0E01 magic of payload frames.

It covers everything after the checksum field to the end of the frame: metadataSize, metadata
and payload. The ``crc32c`` package (loaded by ``keyshared.crc``) uses the CPU's CRC instructions where available.
"""

from __future__ import annotations

from keyshared.crc import crc32c as _crc32c

Bytes = bytes | bytearray | memoryview
"""Any contiguous byte buffer the codec accepts."""


crc32c = _crc32c
"""CRC32C of ``data``; pass a previous result as ``crc`` to continue over several pieces:
``crc32c(data, crc)``. ``crc32c(b"123456789") == 0xE3069283``. The C function itself, not a
wrapper: it runs once per frame each way.
"""


def verify(data: Bytes, expected: int) -> bool:
    """Whether ``data`` has the CRC32C ``expected``."""
    return crc32c(data) == expected
