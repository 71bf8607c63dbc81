import os, sys; sys.path.insert(0, os.environ["CHECK_DIR"]); import vmdcheck  # first: it takes vmd's nonce
import configparser, subprocess, sys
c = configparser.ConfigParser(); c.read("server.ini")
assert c["server"]["port"] == "8081", c["server"]["port"]
assert c["server"]["host"] == "127.0.0.1" and c["server"]["workers"] == "4", dict(c["server"])
assert subprocess.run([sys.executable, "check_config.py"], timeout=30).returncode == 0
vmdcheck.solved("port ok")
