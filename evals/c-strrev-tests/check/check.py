import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, subprocess
check = os.environ["CHECK_DIR"]
t = subprocess.run(["make", "test"], capture_output=True, text=True, timeout=120)
assert t.returncode == 0, t.stdout + t.stderr
b = subprocess.run(["gcc", "-Wall", "-Werror", "-I.", "-o", os.path.join(check, "h"), os.path.join(check, "harness.c"), "strrev.c"],
                   capture_output=True, text=True, timeout=60)
assert b.returncode == 0, b.stderr
r = subprocess.run([os.path.join(check, "h")], capture_output=True, text=True, timeout=10)
assert r.returncode == 0, r.stdout + r.stderr
vmdcheck.solved("strrev ok")
