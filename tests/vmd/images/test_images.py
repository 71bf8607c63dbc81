"""Guest images (vmd/machines/images.py, vmd/images/build.py): where they live, the recipe hash
that names them, how a missing one is reported, and a build run through a fake recipe whose build.sh only writes
a manifest. No real image is built and no guest boots."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmd.host_env import clean_env
from vmd.images import build as image_build
from vmd.images.build import ImageBuildError
from vmd.machines import images
from vmd.machines.images import ImageMissing

MANIFEST = {"name": "tiny", "os_family": "linux", "distro": "debian", "user": "agent",
            "project_path": "/mnt/project", "resolution": [1280, 800], "desktop": False,
            "kernel": "vmlinuz", "initrd": "initrd.img"}

# A recipe's build script as vmd runs it: `bash build.sh OUTDIR`. It counts its runs in
# a file beside the recipe, keeps the environment it was given, and leaves a manifest.
BUILD_SH = """\
set -eu
out=$1
echo run >> "$(dirname "$0")/../runs.txt"
mkdir -p "$out"
echo "STEP 1/2 debootstrap"
echo "  I: Retrieving InRelease"
env > "$out/env.txt"
echo "STEP 2/2 write the manifest"
cat > "$out/manifest.json" <<'EOF'
{manifest}
EOF
"""


@pytest.fixture
def recipes(tmp_path):
    """A recipes folder with one recipe, `tiny`, that builds in milliseconds."""
    folder = tmp_path / "recipes"
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "build.sh").write_text(BUILD_SH.replace("{manifest}", json.dumps(MANIFEST)))
    (folder / "tiny" / "packages.txt").write_text("openssh-server\n")
    return folder


def built(root: Path, folder: str, **fields) -> Path:
    """An image folder as a finished build leaves it."""
    (root / folder).mkdir(parents=True)
    (root / folder / "manifest.json").write_text(json.dumps({**MANIFEST, **fields}))
    return root / folder


def runs(recipes: Path) -> int:
    log = recipes / "runs.txt"
    return len(log.read_text().splitlines()) if log.is_file() else 0


# --- where images live -----------------------------------------------------------------------

def test_the_images_folder_is_vmds_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.delenv("VMD_IMAGES_DIR", raising=False)
    assert images.images_dir() == Path("/var/lib/vmagent/images")
    monkeypatch.setenv("VMD_IMAGES_DIR", str(tmp_path / "cache"))
    assert images.images_dir() == tmp_path / "cache"
    assert images.images_dir(str(tmp_path / "flag")) == tmp_path / "flag", "--images-dir wins"


def test_find_image_without_a_folder_looks_in_the_configured_one(monkeypatch, tmp_path, recipes):
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.setenv("VMD_IMAGES_DIR", str(tmp_path / "cache"))
    built(tmp_path / "cache", "tiny-0123456789abcdef")
    assert images.find_image("tiny", recipes=recipes).dir == tmp_path / "cache" / "tiny-0123456789abcdef"


# --- the recipe hash ------------------------------------------------------------------------

def test_the_recipe_hash_follows_every_file_of_the_recipe(recipes):
    first = images.recipe_hash("tiny", recipes)
    assert len(first) == 16 and first == images.recipe_hash("tiny", recipes), "stable"
    (recipes / "tiny" / "__pycache__").mkdir()
    (recipes / "tiny" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert images.recipe_hash("tiny", recipes) == first, "caches are not the recipe"
    (recipes / "tiny" / "packages.txt").write_text("openssh-server\nxterm\n")
    changed = images.recipe_hash("tiny", recipes)
    assert changed != first
    (recipes / "tiny" / "packages.txt").rename(recipes / "tiny" / "extra.txt")
    assert images.recipe_hash("tiny", recipes) != changed, "a renamed file is a new recipe"


def test_an_unknown_recipe_names_the_known_ones(recipes, tmp_path):
    with pytest.raises(ImageMissing, match=r"no image recipe 'windows' .*\(known: tiny\)"):
        images.recipe_hash("windows", recipes)
    with pytest.raises(ImageMissing, match=r"known: none"):
        images.recipe_hash("tiny", tmp_path / "no-recipes-here")


def test_the_repositorys_recipes_have_a_hash():
    assert len(images.recipe_hash("debian")) == 16


# --- finding a built image ------------------------------------------------------------------

def test_the_image_of_the_current_recipe_comes_first(recipes, tmp_path):
    root = tmp_path / "images"
    current = built(root, f"tiny-{images.recipe_hash('tiny', recipes)}", user="current")
    newer = built(root, "tiny-ffffffffffffffff", user="newer")
    os.utime(current / "manifest.json", (time.time() - 60,) * 2)
    image = images.find_image("tiny", root, recipes)
    assert image.user == "current" and image.dir == current
    assert image.path("kernel") == current / "vmlinuz" and image.resolution == (1280, 800)
    assert newer.is_dir()


def test_without_it_the_newest_built_image_of_the_name(recipes, tmp_path):
    root = tmp_path / "images"
    old = built(root, "tiny-aaaaaaaaaaaaaaaa", user="old")
    built(root, "tiny-bbbbbbbbbbbbbbbb", user="new")
    os.utime(old / "manifest.json", (time.time() - 60,) * 2)
    built(root, "tiny-cccccccccccccccc.partial", user="half-built")
    assert images.find_image("tiny", root, recipes).user == "new"
    # A host without the recipe (a container) finds what was built for it all the same.
    assert images.find_image("tiny", root, tmp_path / "no-recipes").user == "new"


def test_a_missing_image_says_how_to_build_it(recipes, tmp_path):
    root = tmp_path / "images"
    built(root, "other-aaaaaaaaaaaaaaaa")
    with pytest.raises(ImageMissing) as caught:
        images.find_image("tiny", root, recipes)
    message = str(caught.value)
    assert f"no 'tiny' guest image in {root}" in message
    assert "`vmd images build tiny`" in message and "VMD_IMAGES_DIR" in message


# --- building -------------------------------------------------------------------------------

def test_a_build_runs_the_recipe_once_and_leaves_the_image(recipes, tmp_path):
    root, out = tmp_path / "images", io.StringIO()
    image = image_build.build("tiny", root, out=out, recipes=recipes)
    target = root / f"tiny-{images.recipe_hash('tiny', recipes)}"
    assert image.dir == target and image.user == "agent" and runs(recipes) == 1
    assert not target.with_name(target.name + ".partial").exists()
    shown = out.getvalue()
    assert "[##########..........] 2/2" in shown and "Retrieving InRelease" in shown
    assert "ready in" in shown and str(target) in shown
    assert "STEP 2/2 write the manifest" in (root / f"{target.name}.log").read_text()

    again = io.StringIO()
    assert image_build.build("tiny", root, out=again, recipes=recipes).dir == target
    assert "up to date" in again.getvalue() and runs(recipes) == 1, "an unchanged recipe is not rebuilt"
    (recipes / "tiny" / "packages.txt").write_text("xterm\n")
    assert image_build.build("tiny", root, out=io.StringIO(), recipes=recipes).dir != target
    assert runs(recipes) == 2, "a changed recipe builds a new image"


def test_a_failed_build_shows_the_end_of_its_log(recipes, tmp_path):
    (recipes / "tiny" / "build.sh").write_text('echo "STEP 1/3 debootstrap"\n'
                                               'echo "no Debian mirror found; set VMD_APT_MIRROR" >&2\nexit 3\n')
    root = tmp_path / "images"
    with pytest.raises(ImageBuildError) as caught:
        image_build.build("tiny", root, out=io.StringIO(), recipes=recipes)
    assert "building tiny failed (exit 3)" in str(caught.value)
    assert "set VMD_APT_MIRROR" in str(caught.value), "stderr is in the log too"
    assert not list(root.glob("tiny-*/manifest.json"))


def test_a_recipe_without_a_build_script_cannot_be_built_here(recipes, tmp_path):
    (recipes / "tiny" / "build.sh").unlink()
    with pytest.raises(ImageBuildError, match=r"cannot be built on this host .* see .*tiny/README.md"):
        image_build.build("tiny", tmp_path / "images", out=io.StringIO(), recipes=recipes)


def test_the_build_script_gets_its_settings_and_a_proxy_but_never_a_token(recipes, tmp_path, monkeypatch):
    monkeypatch.setenv("VMD_APT_MIRROR", "http://mirror.local/debian")
    monkeypatch.setenv("https_proxy", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    monkeypatch.setenv("GITEA_TOKEN", "secret-token")
    monkeypatch.setenv("VMAGENT_SERVICE_TOKEN", "another-secret")
    monkeypatch.setenv("HOME", str(tmp_path / "roots-home"))
    image = image_build.build("tiny", tmp_path / "images", out=io.StringIO(), recipes=recipes)
    env = dict(line.split("=", 1) for line in (image.dir / "env.txt").read_text().splitlines() if "=" in line)
    assert env["VMD_APT_MIRROR"] == "http://mirror.local/debian"
    assert env["https_proxy"] == "http://proxy:3128" and env["NO_PROXY"] == "localhost"
    assert "GITEA_TOKEN" not in env and "VMAGENT_SERVICE_TOKEN" not in env
    assert env["HOME"] != str(tmp_path / "roots-home") and env["GIT_CONFIG_NOSYSTEM"] == "1"


def test_the_build_environment_allow_list():
    env = image_build.build_env({"VMD_APT_SUITE": "bookworm", "HTTP_PROXY": "http://p", "GITEA_TOKEN": "t",
                            "AWS_SECRET_ACCESS_KEY": "k", "PATH": "/opt/bin"})
    assert env["VMD_APT_SUITE"] == "bookworm" and env["HTTP_PROXY"] == "http://p"
    assert "GITEA_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PATH"] == clean_env()["PATH"], "the host's own PATH: only VMD_* and proxies are passed"


# --- the commands ---------------------------------------------------------------------------

def test_images_list_shows_what_is_built(recipes, tmp_path, capsys):
    root = tmp_path / "images"
    built(root, "tiny-aaaaaaaaaaaaaaaa", desktop=True)
    assert image_build.cli_list(SimpleNamespace(images_dir=str(root))) == 0
    assert "tiny-aaaaaaaaaaaaaaaa" in capsys.readouterr().out
    assert image_build.cli_list(SimpleNamespace(images_dir=str(tmp_path / "empty"))) == 0
    assert "build one with `vmd images build debian`" in capsys.readouterr().out


def test_the_commands_refuse_a_configuration_they_cannot_use(monkeypatch, capsys):
    monkeypatch.delenv("VMD_CONFIG", raising=False)
    monkeypatch.setenv("VMD_ACCEL", "fast")
    assert image_build.cli_list(SimpleNamespace(images_dir=None)) == 2
    assert image_build.cli_build(SimpleNamespace(name="debian", images_dir=None)) == 2
    err = capsys.readouterr().err
    assert "vmd images list: vmd's configuration is invalid" in err and "VMD_ACCEL (accel)" in err


def test_an_unknown_recipe_is_a_sentence_not_a_traceback(tmp_path, capsys):
    assert image_build.cli_build(SimpleNamespace(name="beos", images_dir=str(tmp_path))) == 1
    assert "vmd images build: there is no image recipe 'beos'" in capsys.readouterr().err
