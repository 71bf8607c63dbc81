import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import subprocess, sys
def s(*a): return subprocess.run([sys.executable, "shout.py", *a], capture_output=True, text=True, timeout=30)
assert s("--upper", "hello", "world").stdout.strip() == "HELLO WORLD", s("--upper", "hello", "world")
assert s("hello", "World").stdout.strip() == "hello World"
r = subprocess.run([sys.executable, "-m", "unittest", "-q", "test_shout"], capture_output=True, text=True, timeout=60)
assert r.returncode == 0, r.stderr[-800:]
vmdcheck.solved("shout ok")
