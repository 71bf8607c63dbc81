import unittest
from roman import to_roman
class RomanTest(unittest.TestCase):
    def test_known(self):
        for n, r in [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"),
                     (944, "CMXLIV"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")]:
            self.assertEqual(to_roman(n), r, n)
    def test_range(self):
        for bad in (0, 4000, -3):
            with self.assertRaises(ValueError): to_roman(bad)
