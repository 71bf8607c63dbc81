"""Shared fixtures: the guest image and real machines for `vm` tests.

`vm` tests boot real guests under libvirt. Outside CI they are skipped when the image
or libvirtd is missing (with the command that fixes it); in CI (env CI set) they fail
instead, so a green CI always means the guests really ran.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.support.vmd_fakes import ROOM_TEMPLATES
from vmd.machines.images import ImageMissing, find_image

# vmd's pool is "auto" by default: on a host with two cores or more every vmd a test starts
# would boot a warm machine in the background, beside the guests the tests time. The pool's
# own tests turn it on where they measure it; every other vmd, in-process or `vmd serve`,
# runs without one.
os.environ.setdefault("VMD_WARM_POOL_SIZE", "0")
# Nor parked clean rooms (vmd/machines/parked_rooms.py): a vmd the tests start would keep
# two guests parked beside the test's own, and tests that count the host's guests saw them
# (CI rehearsal: 6 tests). The tests of parked rooms turn them on in their own config.
os.environ.setdefault("VMD_ROOM_PARKED", "0")
# And every vmd keeps its clean rooms' templates in the suite's one folder
# (tests/support/vmd_fakes.py ROOM_TEMPLATES), `vmd serve` too: a vmd with templates of its own
# in its state dir boots two rooms cold and saves them at its first finish (99.5 s of a
# 150 s test here, against 11 s restoring them). A test of templates names its own folder.
os.environ.setdefault("VMD_ROOM_TEMPLATES_DIR", str(ROOM_TEMPLATES))


def _ray_token_for_the_session() -> None:
    """Every Ray process the tests start (the harness's clusters, the services' shims and the
    nodes' workers inherit it) runs with token authentication, as a deployment does
    (vmagent/fleet/cluster_auth.py): one token for the session, in a private temp file. Set
    here, before any test module imports Ray (Ray reads RAY_AUTH_MODE when it starts)."""
    if os.environ.get("RAY_AUTH_MODE") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    import atexit
    import shutil
    import tempfile

    from vmagent.fleet.cluster_auth import make_token

    folder = tempfile.mkdtemp(prefix="vmagent-test-ray-")
    atexit.register(shutil.rmtree, folder, True)
    make_token(Path(folder) / "token")
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(Path(folder) / "token")


_ray_token_for_the_session()
# Every test cluster is on 127.0.0.1: Ray, when first imported, must not swap it for the
# machine's public address (vmagent/fleet/placement.py keep_loopback). Here, before any test
# module imports Ray: a module that set it itself came too late when another module, collected
# before it, had imported Ray first (tests/vmagent/fleet/test_hosts.py after tests/vmagent/fleet/test_ray_executor.py hung
# on a driver connecting to the swapped address).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_addoption(parser):
    parser.addoption("--regold", action="store_true",
                     help="write the golden files the tests compare against (tests/support/golden.py) "
                          "instead of failing on a difference; then read `git diff tests/support/golden`")


def pytest_configure(config):
    # Through the environment, so that xdist's workers, which run this hook with the same
    # options, and any test reading it see the same switch.
    if config.getoption("regold"):
        from tests.support.golden import REGOLD_ENV

        os.environ[REGOLD_ENV] = "1"


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"vm tests must run in CI, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def debian_image():
    try:
        image = find_image("debian")
    except ImageMissing as exc:
        _unavailable(str(exc))
    try:
        import libvirt

        libvirt.open("qemu:///system").close()
    except Exception as exc:  # libvirt not installed or libvirtd not running
        _unavailable(f"libvirtd is not reachable ({exc}); start it with `virtlogd -d; libvirtd -d`")
    return image


def make_traversable(path: Path) -> None:
    """QEMU runs as libvirt's unprivileged user: pytest's private temp folders (0700) must
    let it pass to the overlays and project folders a test makes under them."""
    for folder in [*reversed(Path(path).parents), Path(path)]:
        try:
            mode = folder.stat().st_mode
            if not mode & 0o001:
                os.chmod(folder, (mode & 0o7777) | 0o001)
        except OSError:
            pass


@pytest.fixture(autouse=True)
def _tmp_reachable_by_qemu(request):
    if request.node.get_closest_marker("vm") is not None:
        make_traversable(request.getfixturevalue("tmp_path"))
        make_traversable(request.config._tmp_path_factory.getbasetemp())


@pytest.fixture
def machine_factory(debian_image, tmp_path):
    """Creates machines and destroys whatever a test leaves behind."""
    from vmd.machines.machine import Machine

    made: list[Machine] = []

    def make(project_dir: Path | None = None, **kwargs) -> Machine:
        name = f"vmtest-{uuid.uuid4().hex[:8]}"
        machine = Machine.create(debian_image, name=name, workdir=tmp_path / name,
                                 project_dir=project_dir, **kwargs)
        made.append(machine)
        return machine

    yield make
    for machine in made:
        machine.destroy()


@pytest.hookimpl(optionalhook=True)  # the hook is pytest-xdist's: without it, never called
def pytest_xdist_make_scheduler(config, log):
    # Under pytest-xdist (`-n 2`, the README's test command): tests/support/lanes.py.
    if config.getvalue("dist") in ("load", "loadgroup"):
        from tests.support.lanes import LaneScheduling

        return LaneScheduling(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    # Slow real-guest tests run last so that a quick failure elsewhere shows first. (Under
    # xdist the guest lane is scheduled first instead: tests/support/lanes.py.)
    items.sort(key=lambda item: item.get_closest_marker("vm") is not None)
    # Each test's counted markers travel with its reports (to xdist's controller too): a
    # report's `keywords` also hold the names of its folders, and tests/vmagent/fleet/ or
    # tests/vmagent/openwebui/ are not the `fleet` or `openwebui` marker.
    for item in items:
        marks = sorted({m.name for m in item.iter_markers()} & set(COUNTED_MARKERS))
        item.user_properties.append((MARKERS_PROPERTY, ",".join(marks)))


# --- the counts CI checks: for each marker that must run there (real guests, a real Open
# WebUI, the compose stack, a real Ray cluster, the compose fleet), how many of its tests ran and how many were skipped ---------

COUNTED_MARKERS = ("vm", "openwebui", "compose", "ray", "fleet")
MARKERS_PROPERTY = "counted_markers"


def _markers_of(report) -> list[str]:
    marks = dict(report.user_properties).get(MARKERS_PROPERTY, "")
    return [m for m in marks.split(",") if m]


_outcomes: dict[str, dict[str, str]] = {marker: {} for marker in COUNTED_MARKERS}


# Where the suite's time goes, for CI's log (.ci/run prints it): seconds of setup, call and
# teardown by marker ("rest": none of the counted ones), by xdist worker (its busy time: the
# lanes of tests/support/lanes.py should end together) and by module.
_seconds: dict[str, dict[str, float]] = {"marker": {}, "worker": {}, "module": {}}


def _add_seconds(report) -> None:
    markers = _markers_of(report) or ["rest"]
    node = getattr(report, "node", None)  # set by pytest-xdist on the controller's copy
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    module = report.nodeid.split("::", 1)[0]
    for kind, key in [*(("marker", m) for m in markers), ("worker", worker), ("module", module)]:
        _seconds[kind][key] = _seconds[kind].get(key, 0.0) + float(report.duration or 0.0)


def pytest_runtest_logreport(report):
    _add_seconds(report)
    for marker in _markers_of(report):
        outcomes = _outcomes[marker]
        if report.skipped:
            outcomes[report.nodeid] = "skipped"
        elif report.when == "call":
            outcomes[report.nodeid] = report.outcome
        elif report.failed:
            outcomes[report.nodeid] = "error"


def pytest_sessionfinish(session, exitstatus):
    target = os.environ.get("MARKED_TESTS_REPORT")
    # Under pytest-xdist each worker sees only its own tests; the controller, which gets
    # every worker's reports, writes the counts.
    if target and not hasattr(session.config, "workerinput"):
        import json

        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps({**_outcomes, "seconds": _seconds}, indent=1))
