"""Reads, writes and CRC-32s of large buffers, split over a few threads.

zlib.crc32, os.preadv and os.pwrite release the GIL, so pieces of one large
buffer run on several cores at once. A CRC-32 of consecutive pieces is put
together as zlib's crc32_combine does (the CRC register shifted over the
second piece's length by a GF(2) matrix power), so the result is exactly
zlib.crc32 of the whole buffer.
"""
from __future__ import annotations

import functools
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

PIECE = 16 << 20
"""Bytes per piece: large enough that a call's overhead is nothing, small
enough that a few hundred MB split over every thread."""

_POLY = 0xEDB88320  # CRC-32 (IEEE 802.3), reflected


def _times(mat: Sequence[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _square(mat: Sequence[int]) -> List[int]:
    return [_times(mat, mat[n]) for n in range(32)]


@functools.lru_cache(maxsize=16)
def _shift(nbytes: int) -> Tuple[int, ...]:
    """The matrix that moves a CRC-32 register over nbytes zero bytes."""
    sq = [_POLY] + [1 << n for n in range(31)]  # over one zero bit
    sq = _square(_square(sq))  # over four
    result: Optional[List[int]] = None
    n = nbytes
    while n:  # sq is squared to the operator over 2**i bytes for bit i of n
        sq = _square(sq)
        if n & 1:
            result = sq if result is None else [_times(sq, c) for c in result]
        n >>= 1
    assert result is not None
    return tuple(result)


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of a + b from crc1 = CRC-32 of a, crc2 = CRC-32 of b and
    len2 = len(b)."""
    if len2 == 0:
        return crc1
    return _times(_shift(len2), crc1) ^ crc2


T = TypeVar("T")


class Pool:
    """A few threads for large reads, writes and CRCs; one per Snapshots."""

    def __init__(self, threads: Optional[int] = None) -> None:
        self.threads = threads or max(1, min(8, os.cpu_count() or 1))
        self._pool: Optional[ThreadPoolExecutor] = None

    def _run(self, f: Callable[[T], int], items: Sequence[T]) -> List[int]:
        """f of each item, in order, on the threads when there is more than one."""
        if self.threads == 1 or len(items) <= 1:
            return [f(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gorun-snapshot-io")
        return list(self._pool.map(f, items))

    def _map(self, f: Callable[[Tuple[int, int]], int], length: int) -> List[Tuple[int, int]]:
        """f of each (offset, bytes) piece of length bytes, with its bytes."""
        pieces = [(off, min(PIECE, length - off)) for off in range(0, length, PIECE)]
        return [(p[1], r) for p, r in zip(pieces, self._run(f, pieces))]

    def crc32(self, view: memoryview) -> int:
        """zlib.crc32 of view (bytes), its pieces on several threads."""
        crc = 0
        for n, piece_crc in self._map(lambda p: zlib.crc32(view[p[0]:p[0] + p[1]]), len(view)):
            crc = combine(crc, piece_crc, n)
        return crc

    def pread(self, fd: int, view: memoryview, off: int) -> int:
        """Fill view from fd at offset off; the bytes read (fewer only where
        the file ends first)."""
        return self.pread_many(fd, [(view, off)])

    def pread_many(self, fd: int, reads: Sequence[Tuple[memoryview, int]]) -> int:
        """Fill each view of reads from fd at its offset, the pieces of all
        of them on the threads at once (many small tensors are read as fast
        as one large one); the bytes read in all (fewer only where the file
        ends first)."""
        pieces = [(view, off + at, at, min(PIECE, len(view) - at))
                  for view, off in reads for at in range(0, len(view), PIECE)]

        def one(piece: Tuple[memoryview, int, int, int]) -> int:
            view, off, at, n = piece
            done = 0
            while done < n:
                got = os.preadv(fd, [view[at + done:at + n]], off + done)
                if got == 0:
                    break
                done += got
            return done
        return sum(self._run(one, pieces))

    def crc32_file(self, fd: int, off: int, length: int, chunk: int) -> Tuple[int, int]:
        """zlib.crc32 of length bytes of fd from off, and the bytes read
        (fewer only where the file ends first): its pieces on several
        threads, each read through a buffer of chunk bytes of its own that
        stays in the cache."""
        def one(p: Tuple[int, int]) -> int:
            buf = memoryview(bytearray(min(chunk, p[1]) or 1))
            crc, done = 0, 0
            while done < p[1]:
                want = buf[:min(len(buf), p[1] - done)]
                got = os.preadv(fd, [want], off + p[0] + done)
                if got == 0:
                    raise EOFError(off + p[0] + done)
                crc = zlib.crc32(want[:got], crc)
                done += got
            return crc
        crc = 0
        try:
            for n, piece_crc in self._map(one, length):
                crc = combine(crc, piece_crc, n)
        except EOFError as e:
            return crc, e.args[0] - off
        return crc, length

    def pwrite(self, fd: int, view: memoryview, off: int) -> None:
        """Write view to fd at offset off."""
        def one(p: Tuple[int, int]) -> int:
            done = 0
            while done < p[1]:
                done += os.pwrite(fd, view[p[0] + done:p[0] + p[1]], off + p[0] + done)
            return done
        self._map(one, len(view))

    def close(self) -> None:
        """Stop the threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
