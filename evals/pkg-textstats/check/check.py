import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, shutil, subprocess, sys, tempfile
d = tempfile.mkdtemp()
subprocess.run([sys.executable, "-m", "venv", os.path.join(d, "v")], check=True, timeout=300)
src = os.path.join(d, "src"); shutil.copytree(os.getcwd(), src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
pip = subprocess.run([os.path.join(d, "v", "bin", "pip"), "install", "--no-index", "--no-build-isolation", "--no-use-pep517", src],
                     capture_output=True, text=True, timeout=600)
assert pip.returncode == 0, pip.stdout[-1500:] + pip.stderr[-1500:]
shutil.rmtree(src)
# The installed package runs only in the venv's child; its answers are compared here.
r = vmdcheck.run([os.path.join(d, "v", "bin", "python"), os.path.join(vmdcheck.CHECK_DIR, "use.py")], cwd=d, timeout=60)
head, sep, answers = r.stdout.rpartition("@@answers@@")
assert sep, (r.stdout[-800:], r.stderr[-800:])
import json
got = json.loads(answers)
assert got[0] == {"the": 3, "cat": 1, "and": 1, "hat": 1, "end": 1}, got
assert got[1] == [["b", 3], ["a", 2]] and got[2] == [["x", 1], ["y", 1]], got
assert got[3] == {"don't": 1, "stop": 1}, got
vmdcheck.solved("textstats ok")
