import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import os, shutil, subprocess, sys, tempfile
src = os.path.abspath("todo.py")
with tempfile.TemporaryDirectory() as d:
    shutil.copy(src, d)
    def t(*a): return subprocess.run([sys.executable, "todo.py", *a], cwd=d, capture_output=True, text=True, timeout=30)
    assert t("add", "buy milk").stdout.strip() == "1"
    assert t("add", "call mum").stdout.strip() == "2"
    assert t("list").stdout.splitlines() == ["1. buy milk", "2. call mum"], t("list").stdout
    assert t("done", "1").returncode == 0
    assert t("list").stdout.splitlines() == ["2. call mum"]
    r = t("done", "9"); assert r.returncode == 2 and r.stderr.strip(), r
    assert os.path.exists(os.path.join(d, "todo.json"))
r = subprocess.run([sys.executable, "-m", "unittest", "test_todo"], capture_output=True, text=True, timeout=120)
assert r.returncode == 0 and "Ran 0 tests" not in r.stderr, r.stderr[-800:]
vmdcheck.solved("todo ok")
