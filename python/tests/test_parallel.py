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


if __name__ == "__main__":
    unittest.main()
