import os, subprocess, sys
for root, _, files in os.walk("."):
    for f in files:
        if f.endswith(".py"):
            assert "calc_total" not in open(os.path.join(root, f)).read(), f"calc_total is still in {f}"
sys.path.insert(0, ".")
from shop.pricing import order_total
from shop.cart import checkout
assert order_total([(2, 1.5), (1, 3.0)]) == 6.0 and checkout([(1, 10.0)], 0.1) == 9.0
r = subprocess.run([sys.executable, "-m", "unittest", "-q"], capture_output=True, text=True, timeout=60)
assert r.returncode == 0 and "Ran 0" not in r.stderr, r.stderr[-800:]
print("rename ok")
