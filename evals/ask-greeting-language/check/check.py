import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
text = open("greeting.txt", encoding="utf-8").read().strip()
assert text == "Guten Tag", repr(text)
vmdcheck.solved("greeting ok")
