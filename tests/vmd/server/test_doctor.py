"""`vmd doctor` (vmd/server/doctor.py): each failure it names, made real with the stand-ins: the
fake Gitea with a token lacking scopes, the Ollama stand-in without the model or its
capabilities, sockets nobody may reach, image builds half done. Fast: no guest boots."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gitea_server import start_gitea
from tests.support.ollama_server import start_ollama, unused_port
from tests.support.vmd_fakes import short_socket_dir
from vmd.server import doctor
from vmd.config import VmdConfig
from vmd.machines.images import recipe_hash

ROOT = Path(__file__).resolve().parents[3]
SERVICE_GID = 4242  # the job service's group: a number no user here has


# --- libvirtd and QEMU ---------------------------------------------------------------------

def test_libvirtd_that_answers_is_ok():
    found = doctor.check_libvirtd("test:///default")
    assert found.status == "ok" and "answers at test:///default" in found.text


def test_libvirtd_that_does_not_answer_says_how_to_start_it(tmp_path):
    found = doctor.check_libvirtd(f"qemu+unix:///system?socket={tmp_path}/absent.sock")
    assert found.status == "fail"
    assert "libvirtd does not answer" in found.text and "libvirtd -d" in found.text


def test_kvm_is_ok_and_tcg_is_a_warning_that_says_why(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert doctor.check_accel(lambda: True).status == "ok"
    forced = doctor.check_accel(lambda: True, setting="qemu")
    assert forced.status == "warn" and "VMD_ACCEL=qemu" in forced.text, "the setting wins over the probe"
    kvm = doctor.check_accel(lambda: False, setting="kvm")
    assert kvm.status == "ok" and "VMD_ACCEL=kvm" in kvm.text
    monkeypatch.setattr(doctor.os.path, "exists", lambda path: False if path == "/dev/kvm" else True)
    tcg = doctor.check_accel(lambda: False)
    assert tcg.status == "warn" and "TCG" in tcg.text and "no /dev/kvm" in tcg.text


def test_the_accel_check_follows_the_configured_setting(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/bin/{name}")
    config = VmdConfig.load(env={"VMD_ACCEL": "tcg"})
    [found] = doctor.run_checks(["accel"], config)
    assert found.status == "warn" and "VMD_ACCEL=tcg" in found.text


def test_no_qemu_is_a_failure(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    found = doctor.check_accel(lambda: True)
    assert found.status == "fail" and "apt-get install qemu-system-x86" in found.text


# --- the guest image -----------------------------------------------------------------------

@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    return folder, f"debian-{recipe_hash('debian')}"


def test_an_image_not_built_says_how_to_build_it(images, tmp_path):
    folder, _ = images
    found = doctor.check_image(folder, proc_root=tmp_path / "proc")
    assert found.status == "fail" and "vmd images build debian" in found.text


def test_a_built_image_is_ok(images, tmp_path):
    folder, current = images
    (folder / current).mkdir()
    (folder / current / "manifest.json").write_text("{}")
    assert doctor.check_image(folder, proc_root=tmp_path / "proc").status == "ok"


def test_an_image_being_built_waits_and_says_how_far(images, tmp_path):
    folder, current = images
    (folder / f"{current}.log").write_text("STEP 1/7 debootstrap bookworm\nSTEP 3/7 install the login key\n")
    build = tmp_path / "proc" / "4711"
    build.mkdir(parents=True)
    (build / "cmdline").write_bytes(b"bash\0/app/images/debian/build.sh\0" + str(folder / f"{current}.partial").encode() + b"\0")
    found = doctor.check_image(folder, proc_root=tmp_path / "proc")
    assert found.status == "wait" and "being built" in found.text and "step 3/7: install the login key" in found.text
    assert not doctor.ready([found])  # a health check waits for it


def test_a_build_that_stopped_shows_the_end_of_its_log(images, tmp_path):
    folder, current = images
    (folder / f"{current}.log").write_text("STEP 1/7 debootstrap\nno Debian mirror found in the host's apt sources; set VMD_APT_MIRROR\n")
    found = doctor.check_image(folder, proc_root=tmp_path / "proc")
    assert found.status == "fail" and "set VMD_APT_MIRROR" in found.text and "last build stopped" in found.text


def test_an_older_image_is_a_warning(images, tmp_path):
    folder, _ = images
    (folder / "debian-0000000000000000").mkdir()
    (folder / "debian-0000000000000000" / "manifest.json").write_text("{}")
    found = doctor.check_image(folder, proc_root=tmp_path / "proc")
    assert found.status == "warn" and "older" in found.text


# --- the socket ----------------------------------------------------------------------------

@pytest.fixture
def run_dir():
    top = short_socket_dir()
    os.chmod(top, 0o755)
    run = top / "run"
    run.mkdir()
    yield run
    shutil.rmtree(top, ignore_errors=True)


def listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o660)  # as vmd/server/rpc.py makes it
    sock.listen(4)
    return sock


def test_no_socket_means_vmd_is_not_serving(run_dir):
    found = doctor.check_socket(run_dir / "vmd.sock")
    assert found.status == "fail" and "does not exist" in found.text and "VMD_SOCKET" in found.text


def test_a_file_that_is_not_a_socket(run_dir):
    (run_dir / "vmd.sock").write_text("")
    assert "is not a socket" in doctor.check_socket(run_dir / "vmd.sock").text


def test_a_stale_socket_nobody_listens_on(run_dir):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(run_dir / "vmd.sock"))
    sock.close()
    found = doctor.check_socket(run_dir / "vmd.sock")
    assert found.status == "fail" and "nothing answers" in found.text


def test_a_socket_the_service_group_may_not_use_is_the_eacces_of_every_job(run_dir):
    # vmd's socket as the issue found it: root:root 0660 in a folder of root's.
    sock = listening(run_dir / "vmd.sock")
    try:
        assert doctor.check_socket(run_dir / "vmd.sock").status == "ok"  # vmd's own user: fine
        os.chmod(run_dir, 0o755)
        found = doctor.check_socket(run_dir / "vmd.sock", str(SERVICE_GID))
        assert found.status == "fail" and "permission denied" in found.text
        assert f"chgrp {SERVICE_GID} {run_dir}" in found.text and "2750" in found.text
        os.chmod(run_dir, 0o700)
        found = doctor.check_socket(run_dir / "vmd.sock", SERVICE_GID)
        assert found.status == "fail" and f"may not enter {run_dir}" in found.text
    finally:
        sock.close()


def test_the_setgid_folder_gives_the_socket_the_service_group(run_dir):
    # What the vmd container's entrypoint does with VMD_SOCKET_GROUP.
    os.chown(run_dir, 0, SERVICE_GID)
    os.chmod(run_dir, 0o2750)
    sock = listening(run_dir / "vmd.sock")
    try:
        assert (run_dir / "vmd.sock").stat().st_gid == SERVICE_GID
        found = doctor.check_socket(run_dir / "vmd.sock", SERVICE_GID)
        assert found.status == "ok" and f"gid {SERVICE_GID}) may connect" in found.text
    finally:
        sock.close()


def test_an_unknown_group_name_is_named(run_dir):
    sock = listening(run_dir / "vmd.sock")
    try:
        found = doctor.check_socket(run_dir / "vmd.sock", "no-such-group-here")
        assert found.status == "fail" and "does not exist" in found.text
    finally:
        sock.close()


# --- Gitea ---------------------------------------------------------------------------------

def gitea_config(url: str, token: str, **more) -> VmdConfig:
    return VmdConfig.load(env={}, gitea_url=url, gitea_token=token, **more)


def test_gitea_with_a_token_that_has_the_scopes_is_ok(tmp_path):
    with start_gitea(tmp_path, scopes={"write:repository", "write:organization", "read:user"}) as gitea:
        found = doctor.check_gitea(gitea_config(gitea.url, gitea.token))
        assert found.status == "ok" and "alice's" in found.text
        # the probes changed nothing
        assert not gitea._repos and [a.name for a in gitea._accounts.values()] == ["alice"]


def test_gitea_names_each_missing_scope(tmp_path):
    with start_gitea(tmp_path, scopes={"read:user"}) as gitea:
        found = doctor.check_gitea(gitea_config(gitea.url, gitea.token))
    assert found.status == "fail" and "lacks write:repository, write:organization" in found.text


def test_gitea_asks_for_admin_only_when_vmd_creates_accounts(tmp_path):
    scopes = {"write:repository", "write:organization", "read:user"}
    with start_gitea(tmp_path, scopes=scopes, admin=True) as gitea:
        found = doctor.check_gitea(gitea_config(gitea.url, gitea.token, gitea_create_users=True))
    assert found.status == "fail" and "lacks write:admin" in found.text


def test_gitea_without_read_user(tmp_path):
    with start_gitea(tmp_path, scopes={"write:repository"}) as gitea:
        found = doctor.check_gitea(gitea_config(gitea.url, gitea.token))
    assert found.status == "fail" and "read:user" in found.text


def test_gitea_refusing_the_token(tmp_path):
    with start_gitea(tmp_path) as gitea:
        found = doctor.check_gitea(gitea_config(gitea.url, "not-the-token"))
    assert found.status == "fail" and "refuses the token (401" in found.text and "make a new one" in found.text


def test_gitea_not_answering_and_not_configured():
    found = doctor.check_gitea(gitea_config(f"http://127.0.0.1:{unused_port()}", "t"), timeout=3)
    assert found.status == "fail" and "does not answer" in found.text
    assert doctor.check_gitea(gitea_config("", "")).status == "warn"
    found = doctor.check_gitea(gitea_config("http://gitea:3000", ""))
    assert found.status == "fail" and "GITEA_TOKEN is empty" in found.text


# --- Ollama --------------------------------------------------------------------------------

def test_ollama_with_a_tool_calling_vision_model_is_ok():
    with start_ollama(models=["qwen3-vl:32b"]) as server:
        found = doctor.check_ollama(server.url, "qwen3-vl:32b")
    assert found.status == "ok" and "tool calling and vision" in found.text


def test_ollama_without_the_model_says_to_pull_it():
    with start_ollama(models=["llama3.1:8b"]) as server:
        found = doctor.check_ollama(server.url, "qwen3-vl:32b")
    assert found.status == "fail" and "ollama pull qwen3-vl:32b" in found.text


def test_a_model_without_tools_cannot_act():
    with start_ollama(capabilities=["completion", "vision"]) as server:
        found = doctor.check_ollama(server.url, "gemma3:27b")
    assert found.status == "fail" and "cannot call tools" in found.text


def test_a_model_without_vision_needs_ocr():
    with start_ollama(capabilities=["completion", "tools"]) as server:
        blind = doctor.check_ollama(server.url, "qwen3:32b", tesseract=False)
        ocr = doctor.check_ollama(server.url, "qwen3:32b", tesseract=True)
    assert blind.status == "warn" and "tesseract-ocr" in blind.text
    assert ocr.status == "ok" and "OCR" in ocr.text


def test_ollama_not_answering():
    found = doctor.check_ollama(f"127.0.0.1:{unused_port()}", "qwen3:32b", timeout=3)
    assert found.status == "fail" and "Ollama does not answer" in found.text and "OLLAMA_HOST" in found.text


# --- the command ---------------------------------------------------------------------------

def test_a_check_that_breaks_is_a_failure_not_a_crash(monkeypatch):
    monkeypatch.setattr(doctor, "check_socket", lambda *a: 1 / 0)
    [found] = doctor.run_checks(["socket"], VmdConfig.load(env={}))
    assert found.status == "fail" and "ZeroDivisionError" in found.text


def test_the_checks_take_their_settings_from_the_config(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(doctor, "check_socket", lambda path, group: seen.update(socket=(path, group)))
    monkeypatch.setattr(doctor, "check_ollama", lambda url, model: seen.update(ollama=(url, model)))
    monkeypatch.setattr(doctor, "check_gitea", lambda config: seen.update(token=config.gitea_token.get_secret_value()))
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    config = VmdConfig.load(env={"VMD_SOCKET": "/run/x/vmd.sock", "VMD_SOCKET_GROUP": "1001",
                                 "OLLAMA_HOST": "http://ollama:11434", "VMAGENT_MODEL": "qwen3:8b",
                                 "GITEA_TOKEN_FILE": str(token_file)})
    doctor.run_checks(["socket", "ollama", "gitea"], config)
    assert seen == {"socket": (Path("/run/x/vmd.sock"), "1001"), "ollama": ("http://ollama:11434", "qwen3:8b"),
                    "token": "from-the-file"}
    seen.clear()
    doctor.run_checks(["socket", "ollama", "gitea"],
                      VmdConfig.load(env={"GITEA_TOKEN": "set", "GITEA_TOKEN_FILE": str(token_file)}))
    assert seen["socket"][1] is None, "no group set: the group is not checked"
    assert seen["ollama"] == ("http://127.0.0.1:11434", "qwen3-vl:32b"), "vmagent's defaults"
    assert seen["token"] == "set", "GITEA_TOKEN wins over the file"


def test_the_command_exits_nonzero_on_a_failure_and_prints_sentences(tmp_path):
    with start_ollama(models=["qwen3:32b"]) as server:
        env = {**os.environ, "OLLAMA_HOST": server.url, "VMAGENT_MODEL": "qwen3:32b",
               "VMD_SOCKET": str(tmp_path / "absent.sock")}
        done = subprocess.run([sys.executable, "-m", "vmd.server.doctor", "--check", "ollama", "--json"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)[0]["status"] == "ok"
        done = subprocess.run([sys.executable, "-m", "vmd.server.doctor", "--check", "socket", "--check", "ollama"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "[FAIL] socket" in done.stdout and "does not exist" in done.stdout and "[ok  ] ollama" in done.stdout
