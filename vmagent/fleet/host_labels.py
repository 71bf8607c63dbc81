"""What a vmd host tells Ray about itself, and how a job asks for one.

A host joins the cluster with labels naming it and its vmd's socket, and with resources
Ray counts: one `vm_slot` per guest it may run at once and one `os_<family>` per slot of
each OS family its images are (docs/scale-out.md has the `ray start` line):

    ray start --address=HEAD:6379 --resources='{"vm_slot": 4, "os_linux": 4}' \
        --labels='{"vmagent-host": "rack1-a", "vmagent-vmd-socket": "/run/vmd/vmd.sock"}'

The socket label may be left out (Ray 2.60 takes a path as a label value only in its
deprecated JSON form): then the node's vmd socket is the VMD_SOCKET of the environment
`ray start` ran in (Ray's workers inherit it), else vmd's default socket.

A job's actor asks for one `vm_slot` and one slot of its guest's family, so Ray places it
only where a guest of that family can run and never more guests on a host than it has.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from vmagent.link import DEFAULT_SOCKET
from vmagent.tools import os_family_of

HOST_LABEL = "vmagent-host"
VMD_SOCKET_LABEL = "vmagent-vmd-socket"
SLOT_RESOURCE = "vm_slot"
OS_RESOURCES = {"linux": "os_linux", "windows": "os_windows"}


def vmagent_version() -> str:
    """The version of vmagent installed in this Python, as its package metadata says: the
    head and every host must run the same one (a job's worker, the loop and the verbs it
    sends are the host's code)."""
    from importlib.metadata import distributions

    found = list(distributions(name="vmagent"))
    # An installed vmagent, by `pip install` or `pip install -e`, is a .dist-info (its metadata
    # in METADATA). The vmagent.egg-info (metadata in PKG-INFO) that `pip install -e .` leaves
    # in a source checkout is build residue, found first wherever the checkout is on sys.path
    # (Ray puts the driver's folder there): it made a test's host with an older vmagent read as
    # current.
    installed = [d for d in found if d.read_text("PKG-INFO") is None] or found
    if installed:
        return installed[0].version
    return "unknown (vmagent is not installed as a package here)"


class MissingHostLabels(RuntimeError):
    """This Ray node was started without vmagent's labels."""


def os_resource(family: str) -> str:
    """Ray's resource name for guests of an OS family ("linux" -> "os_linux")."""
    try:
        return OS_RESOURCES[family]
    except KeyError:
        raise ValueError(f"no Ray resource for OS family {family!r}; known: "
                         f"{', '.join(sorted(OS_RESOURCES))}") from None


def job_resources(os_name: str) -> dict[str, float]:
    """What one job's actor holds while it runs: a guest slot of its OS's family
    (debian/ubuntu -> linux, windows... -> windows; vmagent's own mapping)."""
    return {SLOT_RESOURCE: 1.0, os_resource(os_family_of(os_name)): 1.0}


class HostLabels(BaseModel):
    host: str = Field(min_length=1)
    vmd_socket: str = Field(min_length=1)

    @classmethod
    def from_labels(cls, labels: dict[str, str] | None,
                    environ: dict[str, str] | None = None) -> "HostLabels":
        """The host's name from its label (required); its vmd socket from its label, else
        VMD_SOCKET of `environ` (the node's own environment: Ray's workers inherit the one
        `ray start` ran in), else vmd's default socket."""
        labels = labels or {}
        if not labels.get(HOST_LABEL):
            raise MissingHostLabels(
                f"this Ray node has no {HOST_LABEL} label, so vmagent does not know which vmd host it "
                "is: start the node with `ray start ... --labels="
                f"'{{\"{HOST_LABEL}\": \"<host name>\"}}'`; its vmd socket is the "
                f"{VMD_SOCKET_LABEL} label when given (JSON form only: Ray refuses a path in the "
                f"key=value form), else VMD_SOCKET of `ray start`'s environment, else {DEFAULT_SOCKET} "
                "(docs/scale-out.md)")
        environ = os.environ if environ is None else environ
        socket = labels.get(VMD_SOCKET_LABEL) or environ.get("VMD_SOCKET") or DEFAULT_SOCKET
        return cls(host=labels[HOST_LABEL], vmd_socket=socket)

    @classmethod
    def of_this_node(cls) -> "HostLabels":
        """The labels of the Ray node this code runs on (inside a task or an actor)."""
        import ray

        return cls.from_labels(ray.get_runtime_context().get_node_labels())
