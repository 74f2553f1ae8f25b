"""The slot file format (docs/snapshots-format.md): a 4096-byte header
region, then the payload.

Header, little-endian, in the first 64 bytes of the region (the rest zero):

    0   8  magic b"GORUNSNP"
    8   4  version (1)
    12  4  payload offset (4096)
    16  8  step (unsigned)
    24  8  payload length in bytes
    32  4  CRC-32C of the payload
    36  4  reserved, zero
    40  4  CRC-32C of bytes [0, 40)
    44 20  zero
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Optional

MAGIC = b"GORUNSNP"
VERSION = 1
HEADER_SIZE = 4096
_FMT = "<8sIIQQII"  # up to the header CRC
_FIXED = struct.calcsize(_FMT)  # 40
assert _FIXED == 40


class Header(NamedTuple):
    """A slot's header: the step it holds and its payload's length and CRC."""

    step: int
    length: int
    crc: int


def pack(h: Header, crc_of_bytes) -> bytes:
    """The 64 header bytes of h; crc_of_bytes(b) is CRC-32C."""
    fixed = struct.pack(_FMT, MAGIC, VERSION, HEADER_SIZE, h.step, h.length, h.crc, 0)
    return fixed + struct.pack("<I", crc_of_bytes(fixed)) + bytes(20)


def unpack(raw: bytes, crc_of_bytes) -> Optional[Header]:
    """The header in raw (at least 64 bytes), or None when it is not a
    whole, valid version-1 header (wrong magic, torn, or a bad header CRC)."""
    if len(raw) < 64:
        return None
    magic, version, offset, step, length, crc, _ = struct.unpack(_FMT, raw[:_FIXED])
    (hcrc,) = struct.unpack("<I", raw[_FIXED:_FIXED + 4])
    if magic != MAGIC or version != VERSION or offset != HEADER_SIZE:
        return None
    if crc_of_bytes(raw[:_FIXED]) != hcrc:
        return None
    return Header(step, length, crc)
