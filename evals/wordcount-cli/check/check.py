import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, subprocess, sys, tempfile
def run(args, stdin=None):
    return subprocess.run([sys.executable, "wc.py", *args], input=stdin, capture_output=True, text=True, timeout=30)
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "t.txt")
    open(p, "w").write("one two\nthree\n\nfour five six\n")
    r = run([p]); assert r.returncode == 0 and r.stdout.split() == ["4", "6", "29"], (r.stdout, r.stderr)
    r = run([], "a b c\n"); assert r.stdout.split() == ["1", "3", "6"], r.stdout
    r = run([os.path.join(d, "nope")]); assert r.returncode == 1 and r.stderr.strip(), r
t = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_wc"], capture_output=True, text=True, timeout=120)
assert t.returncode == 0 and " ok" in t.stderr and t.stderr.count(" ok") >= 2, t.stderr[-800:]
vmdcheck.solved("wordcount ok")
