import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
# The project's code runs only in a child (vmdcheck.values); its answers are compared here.
cases = [1, 4, 9, 14, 40, 90, 400, 944, 1994, 3999]
want = ["I", "IV", "IX", "XIV", "XL", "XC", "CD", "CMXLIV", "MCMXCIV", "MMMCMXCIX"]
got = vmdcheck.values("roman", [("to_roman", [n]) for n in cases + [0, 4000, -3]])
assert [g.get("value") for g in got[:len(cases)]] == want, list(zip(cases, got))
assert [g.get("raised") for g in got[len(cases):]] == ["ValueError"] * 3, got[len(cases):]
vmdcheck.solved("roman ok")
