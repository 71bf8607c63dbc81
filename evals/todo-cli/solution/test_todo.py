import os, subprocess, sys, tempfile, shutil, unittest
class T(unittest.TestCase):
    def test_add_list_done(self):
        d = tempfile.mkdtemp(); shutil.copy("todo.py", d)
        run = lambda *a: subprocess.run([sys.executable, "todo.py", *a], cwd=d, capture_output=True, text=True)
        self.assertEqual(run("add", "x").stdout.strip(), "1")
        run("done", "1")
        self.assertEqual(run("list").stdout, "")
