import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import subprocess
subprocess.run(["make", "clean"], capture_output=True, timeout=60)
b = subprocess.run(["make"], capture_output=True, text=True, timeout=120)
assert b.returncode == 0, b.stdout + b.stderr
def calc(*a): return subprocess.run(["./calc", *a], capture_output=True, text=True, timeout=10)
for args, want in [(("2", "+", "3"), "5"), (("7", "-", "10"), "-3"), (("6", "x", "7"), "42"), (("9", "/", "2"), "4")]:
    r = calc(*args); assert r.returncode == 0 and r.stdout.strip() == want, (args, r.stdout, r.stderr)
for args in (("1", "/", "0"), ("1", "%", "2")):
    r = calc(*args); assert r.returncode == 1 and r.stderr.strip(), (args, r)
subprocess.run(["make", "clean"], capture_output=True, timeout=60)
import os; assert not os.path.exists("calc"), "make clean left calc"
subprocess.run(["make"], capture_output=True, timeout=120)
vmdcheck.solved("calc ok")
