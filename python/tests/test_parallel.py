"""The I/O threads' CRC-32, reads and writes give what one thread gives."""
import os
import tempfile
import unittest
import zlib

from gorun import _parallel


class ParallelTest(unittest.TestCase):
    def test_crc32_is_zlibs(self) -> None:
        pool = _parallel.Pool(3)
        self.addCleanup(pool.close)
        piece = _parallel.PIECE
        for n in (0, 1, 4095, piece - 1, piece, piece + 1, 3 * piece + 12345):
            with self.subTest(n=n):
                data = os.urandom(n)
                self.assertEqual(pool.crc32(memoryview(data)), zlib.crc32(data))

    def test_combine(self) -> None:
        for a, b in ((0, 5), (3, 1), (100, 7), (5, 1000), (1 << 20, 3)):
            with self.subTest(a=a, b=b):
                x, y = os.urandom(a), os.urandom(b)
                self.assertEqual(_parallel.combine(zlib.crc32(x), zlib.crc32(y), b), zlib.crc32(x + y))

    def test_pwrite_then_pread(self) -> None:
        pool = _parallel.Pool(3)
        self.addCleanup(pool.close)
        data = os.urandom(2 * _parallel.PIECE + 77)
        with tempfile.TemporaryFile() as f:
            pool.pwrite(f.fileno(), memoryview(data), 10)
            back = bytearray(len(data))
            self.assertEqual(pool.pread(f.fileno(), memoryview(back), 10), len(data))
            self.assertEqual(bytes(back), data)
            short = bytearray(len(data) + 5)  # the file ends 5 bytes before the view
            self.assertEqual(pool.pread(f.fileno(), memoryview(short), 10), len(data))

    def test_pread_many_fills_every_view(self) -> None:
        pool = _parallel.Pool(3)
        self.addCleanup(pool.close)
        piece = _parallel.PIECE
        data = os.urandom(3 * piece + 1000)
        # Small views and views over several pieces, not in file order.
        spans = [(2 * piece + 5, piece + 900), (0, 7), (7, 4089), (4096, piece - 4096), (piece, piece + 5)]
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            bufs = [bytearray(n) for _, n in spans]
            got = pool.pread_many(f.fileno(), [(memoryview(b), off) for b, (off, _) in zip(bufs, spans)])
            self.assertEqual(got, sum(n for _, n in spans))
            for b, (off, n) in zip(bufs, spans):
                self.assertEqual(bytes(b), data[off:off + n], f"the view of {n} bytes at {off}")
            past = bytearray(10)  # 3 bytes of it past the end
            self.assertEqual(pool.pread_many(f.fileno(), [(memoryview(past), len(data) - 7)]), 7)

    def test_crc32_file_is_zlibs(self) -> None:
        pool = _parallel.Pool(3)
        self.addCleanup(pool.close)
        piece = _parallel.PIECE
        data = os.urandom(2 * piece + 333)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            for off, n in ((0, 0), (5, 1), (100, piece), (1, 2 * piece + 332)):
                with self.subTest(off=off, n=n):
                    self.assertEqual(pool.crc32_file(f.fileno(), off, n, 1 << 20),
                                     (zlib.crc32(data[off:off + n]), n))
            crc, n = pool.crc32_file(f.fileno(), 10, len(data), 1 << 20)  # 10 bytes past the end
            self.assertLess(n, len(data))


if __name__ == "__main__":
    unittest.main()
