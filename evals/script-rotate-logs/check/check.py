import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, subprocess, tempfile
d = tempfile.mkdtemp()
open(os.path.join(d, "a.log"), "w").write("third\n")
open(os.path.join(d, "a.log.1"), "w").write("second\n")
open(os.path.join(d, "a.log.2"), "w").write("first\n")
open(os.path.join(d, "keep.txt"), "w").write("x")
r = subprocess.run(["bash", "rotate.sh", d, "2"], capture_output=True, text=True, timeout=30)
assert r.returncode == 0, r.stderr
read = lambda n: open(os.path.join(d, n)).read()
assert read("a.log") == "" and read("a.log.1") == "third\n" and read("a.log.2") == "second\n", sorted(os.listdir(d))
assert not os.path.exists(os.path.join(d, "a.log.3")) and read("keep.txt") == "x", sorted(os.listdir(d))
for bad in (["bash", "rotate.sh"], ["bash", "rotate.sh", "/nonexistent", "2"]):
    r = subprocess.run(bad, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip(), (bad, r)
vmdcheck.solved("rotate ok")
