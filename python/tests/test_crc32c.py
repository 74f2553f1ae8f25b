"""CRC-32C of the torch lanes against the byte-by-byte definition."""
import unittest

import torch

from gorun._crc32c import Crc32c


class Crc32cTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.crc = Crc32c()

    def test_check_value(self) -> None:
        # The CRC-32C check value (RFC 3720 / the CRC catalogue).
        self.assertEqual(self.crc.of_bytes(b"123456789"), 0xE3069283)
        t = torch.tensor(list(b"123456789"), dtype=torch.uint8)
        self.assertEqual(self.crc.update(0, t), 0xE3069283)

    def test_lanes_match_bytewise(self) -> None:
        g = torch.Generator().manual_seed(1)
        data = torch.randint(0, 256, ((1 << 20) + 77,), dtype=torch.uint8, generator=g)
        for start, n in [(0, 0), (0, 1), (0, 4095), (0, 4096), (1, 5000), (3, 100003),
                         (0, 1 << 20), (5, (1 << 20) + 72)]:
            with self.subTest(start=start, n=n):
                piece = data[start:start + n]
                self.assertEqual(self.crc.update(0, piece), self.crc.of_bytes(bytes(piece.tolist())))

    def test_update_continues(self) -> None:
        data = torch.arange(200000, dtype=torch.int64).to(torch.uint8)
        whole = self.crc.update(0, data)
        self.assertEqual(self.crc.update(self.crc.update(0, data[:12345]), data[12345:]), whole)

    def test_one_bit_changes_it(self) -> None:
        data = torch.zeros(1 << 20, dtype=torch.uint8)
        before = self.crc.update(0, data)
        data[777777] = 4
        self.assertNotEqual(self.crc.update(0, data), before)


if __name__ == "__main__":
    unittest.main()
