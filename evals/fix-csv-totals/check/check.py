import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import tempfile
d = tempfile.mkdtemp()
os.chmod(d, 0o755)
sums, header = os.path.join(d, "x.csv"), os.path.join(d, "y.csv")
open(sums, "w").write("category,amount\nfood,2.50\n\nrent,100\nfood,1.25\n\n")
open(header, "w").write("category,amount\n")
got = vmdcheck.values("totals", [("totals", [sums]), ("totals", [header])])
assert [g.get("value") for g in got] == [{"food": 3.75, "rent": 100.0}, {}], got
vmdcheck.solved("totals ok")
