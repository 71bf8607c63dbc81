import unittest

from roman import to_roman


class RomanTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(to_roman(3), "III")

    def test_subtractive(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
