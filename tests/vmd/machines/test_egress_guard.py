"""The egress guard (vmd/machines/egress_guard.py): the rules it writes, its refusals, and on this
host the real nftables table, tried by a process running as QEMU's user. The guest-side
proof (a real guest reaching the stand-in internet and nothing on the host) is
tests/vmd/machines/test_machine_vm.py::test_egress_reaches_the_internet_and_never_the_host."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.vmd_fakes import LocalMachines, local_vmd
from tests.support.vmd_wire import WireVmd
from vmd.config import VmdConfig, VmdConfigError
from vmd.config.egress_allow import Allowed
from vmd.machines.egress_guard import TABLE, EgressGuard, EgressGuardError, Ruleset, host_dns_servers


def test_an_allow_list_entry_needs_a_reason_and_a_real_range():
    assert Allowed.parse("10.1.2.0/24=the apt mirror") == Allowed("10.1.2.0/24", "the apt mirror")
    assert Allowed.parse("10.1.2.3:3128=the proxy") == Allowed("10.1.2.3/32", "the proxy", 3128)
    assert Allowed.parse("[fd00::1]:8080=v6 proxy") == Allowed("fd00::1/128", "v6 proxy", 8080)
    for bad, said in [("10.1.2.0/24", "no reason"), ("10.1.2.0/24=", "no reason"), ("mirror=why", "not an address"),
                      ("10.0.0.1:99999=x", "port"), ('10.0.0.1=say "hi"', "plain text")]:
        with pytest.raises(ValueError, match=said):
            Allowed.parse(bad)


def test_the_setting_is_read_and_checked_at_load():
    config = VmdConfig.load(env={"VMD_EGRESS_ALLOW": "10.1.2.0/24=the apt mirror; 10.1.2.3:3128=the proxy"})
    assert config.egress_allow == ["10.1.2.0/24=the apt mirror", "10.1.2.3:3128=the proxy"]
    with pytest.raises(VmdConfigError, match="VMD_EGRESS_ALLOW.*no reason"):
        VmdConfig.load(env={"VMD_EGRESS_ALLOW": "10.1.2.0/24"})


def test_the_rules_refuse_the_host_and_private_ranges_after_the_holes_opened_on_purpose():
    rules = Ruleset(64055, (Allowed("10.1.2.0/24", "the apt mirror"),), ("10.9.9.53",)).render()
    lines = [line.strip() for line in rules.splitlines()]
    assert "meta skuid != 64055 accept" in lines  # only QEMU's connections are looked at
    assert "ct state established,related accept" in lines  # vmd's SSH to the forward answers
    first_refusal = next(i for i, line in enumerate(lines) if "reject" in line)
    holes = [i for i, line in enumerate(lines) if line.endswith('"the apt mirror"') or "dport 53 accept" in line]
    assert holes and max(holes) < first_refusal
    assert any(line.startswith("meta l4proto tcp fib daddr type { local") for line in lines)
    for blocked in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                    "100.64.0.0/10", "fc00::/7", "fe80::/10", "::ffff:0:0/96"):
        assert blocked in rules
    # The digest names the configuration: another allow-list is another rule set.
    assert Ruleset(64055).digest() != Ruleset(64055, (Allowed("10.1.2.0/24", "x"),)).digest()


def test_the_hosts_resolvers_are_read_from_resolv_conf(tmp_path):
    conf = tmp_path / "resolv.conf"
    conf.write_text("# comment\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver junk\nsearch lan\n")
    assert host_dns_servers(conf) == ["127.0.0.53", "fe80::1"]
    assert host_dns_servers(tmp_path / "absent") == []


def test_without_nftables_egress_is_refused_with_what_to_install(tmp_path):
    guard = EgressGuard("libvirt-qemu", nft=str(tmp_path / "no-nft"))
    guard.nft = ""
    assert "apt-get install nftables" in guard.problem()
    with pytest.raises(EgressGuardError, match="install it"):
        guard.require()


def test_qemu_running_as_root_cannot_be_guarded():
    with pytest.raises(EgressGuardError, match="QEMU runs as root"):
        EgressGuard("root").ruleset()


def test_an_approval_on_a_host_without_the_guard_leaves_the_machine_offline(tmp_path):
    machines = LocalMachines()
    machines.egress_refusal = "nftables is not installed: install it (apt-get install nftables)"
    with local_vmd(tmp_path, machines) as (server, machines, config):
        c = WireVmd(config.socket, timeout=60).connect()
        c.call("session_open", os="debian", project="offline", task="t")
        c.call("plan_tasks", tasks=["one"])
        c.call("session_ready", timeout=30)
        c.call("request_unfreeze", reason="pip install")
        text = c.call("session_resume", approved=True)["text"]
        assert "cannot open network egress" in text and "apt-get install nftables" in text
        machine = machines.machines[f"vmagent-{c.session_id}"]
        assert machine.egress is False
        assert c.call("session_status")["state"] == "ready"
        c.call("session_close")


needs_nft = pytest.mark.skipif(not (shutil.which("nft") and os.geteuid() == 0) and not os.environ.get("CI"),
                               reason="needs root and nftables (setup.sh installs them; CI runs this)")


@needs_nft
def test_the_installed_guard_refuses_qemus_user_the_hosts_loopback_and_is_put_back():
    guard = EgressGuard("libvirt-qemu")
    try:
        guard.install()
        assert guard.problem() is None
        assert guard.probe() is None  # as libvirt-qemu, 127.0.0.1 is refused
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)
        assert "not installed" in guard.problem()
        assert "reached a listener" in guard.probe()  # the probe can tell: without it the host is open
        guard.require()  # vmd puts a missing guard back before it opens egress
        assert guard.problem() is None and guard.probe() is None
    finally:
        guard.install()  # vmd's state on this host: the guard in force
