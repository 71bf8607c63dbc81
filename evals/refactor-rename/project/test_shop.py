import unittest

from shop.cart import checkout
from shop.pricing import calc_total


class ShopTest(unittest.TestCase):
    def test_total(self):
        self.assertEqual(calc_total([(3, 2.0)]), 6.0)

    def test_checkout(self):
        self.assertEqual(checkout([(1, 10.0)], 0.5), 5.0)
