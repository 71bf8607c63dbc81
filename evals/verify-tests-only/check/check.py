import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import hashlib, subprocess, sys
want = {'mathx.py': 'c8c6bfd68c67c2be3187fb480eb0263f869a514e1d785f6d7481db2226446599', 'test_mathx.py': '2c2f4d5dfb3edd7377908f6e5e1d1a0cafcac91d44576836d29c39cfe4e35fdf'}
for name, digest in want.items():
    assert hashlib.sha256(open(name, "rb").read()).hexdigest() == digest, f"{name} was changed"
r = subprocess.run([sys.executable, "-m", "unittest", "-q"], capture_output=True, text=True, timeout=60)
assert r.returncode == 0, r.stderr[-800:]
vmdcheck.solved("unchanged, tests pass")
