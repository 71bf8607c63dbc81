import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, subprocess
assert os.path.exists("main.c") and os.path.exists("mathlib.c"), "the split into two files is gone"
subprocess.run(["make", "clean"], capture_output=True, timeout=60)
subprocess.run(["rm", "-f", "stats", "main.o", "mathlib.o"])
b = subprocess.run(["make"], capture_output=True, text=True, timeout=120)
assert b.returncode == 0 and "warning" not in b.stderr, b.stdout + b.stderr
for args, want in [(["1", "2", "3", "4"], "mean 2.50 max 4"), (["-5", "10"], "mean 2.50 max 10"), (["7"], "mean 7.00 max 7")]:
    r = subprocess.run(["./stats", *args], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stdout.strip() == want, (args, r.stdout, r.stderr)
vmdcheck.solved("stats ok")
