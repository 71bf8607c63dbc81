import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import json
want = {"requests": 1500, "status": {"200": 1040, "201": 74, "304": 162, "404": 138, "500": 86}, "bytes": 6084702, "top_paths": ["/api/items", "/static/app.js", "/"]}
got = json.load(open("summary.json"))
for key in want:
    assert got.get(key) == want[key], (key, got.get(key), want[key])
vmdcheck.solved("summary ok")
