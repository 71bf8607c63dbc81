import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import subprocess
for root, _, files in os.walk("."):
    for f in files:
        if f.endswith(".py"):
            assert "calc_total" not in open(os.path.join(root, f)).read(), f"calc_total is still in {f}"
got = vmdcheck.values("shop.pricing", [("order_total", [[[2, 1.5], [1, 3.0]]])])
assert got[0].get("value") == 6.0, got
got = vmdcheck.values("shop.cart", [("checkout", [[[1, 10.0]], 0.1])])
assert got[0].get("value") == 9.0, got
r = vmdcheck.run(["python3", "-m", "unittest", "-q"])
assert r.returncode == 0 and "Ran 0" not in r.stderr, r.stderr[-800:]
vmdcheck.solved("rename ok")
