import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
cases = {"Hello, World!": "hello-world", "Crème brûlée": "creme-brulee", "  --a--  ": "a", "a   b...c": "a-b-c"}
got = vmdcheck.values("slug", [("slugify", [text]) for text in cases])
assert [g.get("value") for g in got] == list(cases.values()), list(zip(cases, got))
vmdcheck.solved("slugify ok")
