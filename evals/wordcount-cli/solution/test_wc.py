import subprocess, sys, unittest
from wc import counts
class T(unittest.TestCase):
    def test_counts(self):
        self.assertEqual(counts("a b\nc\n"), (2, 3, 6))
    def test_missing(self):
        r = subprocess.run([sys.executable, "wc.py", "/nonexistent"], capture_output=True)
        self.assertEqual(r.returncode, 1)
unittest.main() if __name__ == "__main__" else None
