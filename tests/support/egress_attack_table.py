"""Before/after: what a guest with approved egress reaches without the egress guard and with it, on one
real guest in one run. Run as root on a test host (it removes the guard for the first half and puts it
back): .venv/bin/python tests/support/egress_attack_table.py"""
import subprocess, sys, tempfile, threading, uuid, http.server
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.conftest import make_traversable
from tests.support.egress_hosts import namespace_host, host_addresses
from vmd.config import VmdConfig
from vmd.machines.images import find_image
from vmd.machines.machine import Machine
from vmd.machines.egress_guard import EgressGuard, TABLE
import tests.vmd.machines.test_machine_vm as T

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"reached-the-host")
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Hello); threading.Thread(target=srv.serve_forever, daemon=True).start()
port = srv.server_address[1]
image = find_image("debian", VmdConfig.load().images_dir)
def mk():
    root = Path(tempfile.mkdtemp(prefix="at-")); make_traversable(root)
    (root/"p").mkdir(); import os; os.chmod(root/"p", 0o777)
    return Machine.create(image, name=f"vmtest-{uuid.uuid4().hex[:8]}", workdir=root/"work", project_dir=root/"p")
m = mk(); other = mk()
try:
    m.ready(timeout=400, desktop=False)
    with namespace_host("inet", "203.0.113", "reached-the-internet") as inet, namespace_host("lan", "192.168.231", "reached-lan") as lan:
        targets = {"stand-in internet 203.0.113.2:80": (inet.address, 80),
                   "host loopback via gateway 10.0.3.2": ("10.0.3.2", port),
                   "another guest's SSH forward": ("10.0.3.2", other.ssh_port),
                   "host's veth address": (inet.host_side, port),
                   "private-range host": (lan.address, 80)}
        for i, a in enumerate(host_addresses()):
            targets[f"host interface address {i}"] = (a, port)
        rows = {}
        for phase in ("no guard", "guard"):
            if phase == "no guard":
                subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
            else:
                EgressGuard("libvirt-qemu").install()
            m.set_egress(True)
            T._wait_for(m, "ip -4 route | grep -q '^default via 10.0.3.2' && echo routed", timeout=120)
            for what, (h, p) in targets.items():
                out = T._reach(m, h, p)
                rows.setdefault(what, {})[phase] = "reached" if "unreachable" not in out and out.strip() else "refused"
            m.set_egress(False)
        print(f"{'target':40} {'no guard':10} {'guard':10}")
        for what, r in rows.items():
            print(f"{what:40} {r['no guard']:10} {r['guard']:10}")
finally:
    m.destroy(); other.destroy(); EgressGuard("libvirt-qemu").install()
