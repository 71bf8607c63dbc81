import os, shutil, subprocess, sys, tempfile
d = tempfile.mkdtemp()
subprocess.run([sys.executable, "-m", "venv", os.path.join(d, "v")], check=True, timeout=300)
src = os.path.join(d, "src"); shutil.copytree(os.getcwd(), src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
pip = subprocess.run([os.path.join(d, "v", "bin", "pip"), "install", "--no-index", "--no-build-isolation", "--no-use-pep517", src],
                     capture_output=True, text=True, timeout=600)
assert pip.returncode == 0, pip.stdout[-1500:] + pip.stderr[-1500:]
shutil.rmtree(src)
r = subprocess.run([os.path.join(d, "v", "bin", "python"), os.path.join(os.environ["CHECK_DIR"], "use.py")], cwd=d,
                   capture_output=True, text=True, timeout=60)
print(r.stdout, r.stderr)
assert r.returncode == 0
