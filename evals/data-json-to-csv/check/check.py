import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
want = 'name,age,city\nDev,63,\nFemi,36,Lyon\nHana,65,Lyon\nIvo,50,Lyon\nChloé,20,Oslo\nGus,23,Oslo\nAda,42,Porto\nBjörn,56,Porto\nEun-ji,40,Porto\nJun,29,Porto\n'
got = open("people.csv", encoding="utf-8", newline="").read().replace("\r\n", "\n")
assert got.strip() == want.strip(), (got, want)
vmdcheck.solved("csv ok")
