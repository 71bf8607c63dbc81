import os, tempfile, unittest
from totals import totals
class TotalsTest(unittest.TestCase):
    def test_sums(self):
        p = os.path.join(tempfile.mkdtemp(), "x.csv")
        open(p, "w").write("category,amount\nfood,2.50\n\nrent,100\nfood,1.25\n\n")
        self.assertEqual(totals(p), {"food": 3.75, "rent": 100.0})
    def test_header_only(self):
        p = os.path.join(tempfile.mkdtemp(), "y.csv")
        open(p, "w").write("category,amount\n")
        self.assertEqual(totals(p), {})
