import subprocess
import sys
import unittest


class ShoutTest(unittest.TestCase):
    def test_plain(self):
        out = subprocess.run([sys.executable, "shout.py", "a", "b"], capture_output=True, text=True).stdout
        self.assertEqual(out.strip(), "a b")
