import os
import tempfile
import unittest

from totals import totals


class TotalsTest(unittest.TestCase):
    def test_sums(self):
        path = os.path.join(tempfile.mkdtemp(), "t.csv")
        with open(path, "w") as fh:
            fh.write("category,amount\nfood,2.50\n\nfood,1.50\n")
        self.assertEqual(totals(path), {"food": 4.0})
