"""The slot file format, version 2 (docs/snapshots-format.md): a 4096-byte
header region, then the payload.

Header, little-endian, in the first 64 bytes of the region (the rest zero):

    0   8  magic b"GORUNSNP"
    8   4  version (2)
    12  4  payload offset (4096)
    16  8  step (unsigned)
    24  8  payload length in bytes
    32  4  CRC-32 (IEEE, zlib.crc32) of the payload
    36  4  flags (bit 0: REPLICATED)
    40  4  the global rank that saved it
    44  4  the world size when it was saved
    48  4  CRC-32 of bytes [0, 48)
    52 12  zero
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple, Optional

MAGIC = b"GORUNSNP"
VERSION = 2
HEADER_SIZE = 4096
HEADER_LEN = 64
FLAG_REPLICATED = 1
_FMT = "<8sIIQQIIII"  # up to the header CRC
_FIXED = struct.calcsize(_FMT)
assert _FIXED == 48


class Header(NamedTuple):
    """A slot's header: the step it holds, its payload's length and CRC-32,
    its flags and the rank and world size that saved it."""

    step: int
    length: int
    crc: int
    flags: int
    rank: int
    world: int

    @property
    def replicated(self) -> bool:
        """Whether any rank of any world may restore it (FLAG_REPLICATED)."""
        return bool(self.flags & FLAG_REPLICATED)


def pack(h: Header) -> bytes:
    """The 64 header bytes of h, with the header's own CRC-32."""
    fixed = struct.pack(_FMT, MAGIC, VERSION, HEADER_SIZE, h.step, h.length, h.crc,
                        h.flags, h.rank, h.world)
    return fixed + struct.pack("<I", zlib.crc32(fixed)) + bytes(HEADER_LEN - _FIXED - 4)


def unpack(raw: bytes) -> Optional[Header]:
    """The header in raw (at least 64 bytes), or None when it is not a
    whole, valid version-2 header (wrong magic, version or offset, torn, a
    bad header CRC, an unknown flag, or a rank outside its world)."""
    if len(raw) < HEADER_LEN:
        return None
    magic, version, offset, step, length, crc, flags, rank, world = struct.unpack(
        _FMT, raw[:_FIXED])
    (hcrc,) = struct.unpack("<I", raw[_FIXED:_FIXED + 4])
    if magic != MAGIC or version != VERSION or offset != HEADER_SIZE:
        return None
    if zlib.crc32(raw[:_FIXED]) != hcrc:
        return None
    if flags & ~FLAG_REPLICATED or world < 1 or rank >= world:
        return None
    return Header(step, length, crc, flags, rank, world)
