import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import subprocess
# The click itself is a shell script (xdotool); it runs after vmdcheck took the nonce.
r = vmdcheck.run(["bash", os.path.join(vmdcheck.CHECK_DIR, "click.sh")], extra_env={"CHECK_DIR": vmdcheck.CHECK_DIR}, timeout=100)
print(r.stdout[-800:], r.stderr[-800:])
assert r.returncode == 0, "the click did not write clicked.txt"
vmdcheck.solved("click ok")
