"""What a vmd host tells Ray about itself, and how a job asks for one.

A host joins the cluster with labels naming it and its vmd's socket, and with resources
Ray counts: one `vm_slot` per guest it may run at once and one `os_<family>` per slot of
each OS family its images are (docs/scale-out.md has the `ray start` line):

    ray start --address=HEAD:6379 --resources='{"vm_slot": 4, "os_linux": 4}' \
        --labels='{"vmagent-host": "rack1-a", "vmagent-vmd-socket": "/run/vmd/vmd.sock"}'

A job's actor asks for one `vm_slot` and one slot of its guest's family, so Ray places it
only where a guest of that family can run and never more guests on a host than it has.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from vmagent.tool_table import os_family_of

HOST_LABEL = "vmagent-host"
VMD_SOCKET_LABEL = "vmagent-vmd-socket"
SLOT_RESOURCE = "vm_slot"
OS_RESOURCES = {"linux": "os_linux", "windows": "os_windows"}


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
    def from_labels(cls, labels: dict[str, str] | None) -> "HostLabels":
        labels = labels or {}
        missing = [name for name in (HOST_LABEL, VMD_SOCKET_LABEL) if not labels.get(name)]
        if missing:
            raise MissingHostLabels(
                f"this Ray node has no {' and no '.join(missing)} label, so vmagent does not know "
                "which vmd host it is: start the node with `ray start ... --labels="
                f"'{{\"{HOST_LABEL}\": \"<host name>\", \"{VMD_SOCKET_LABEL}\": \"<vmd socket path>\"}}'` "
                "(docs/scale-out.md)")
        return cls(host=labels[HOST_LABEL], vmd_socket=labels[VMD_SOCKET_LABEL])

    @classmethod
    def of_this_node(cls) -> "HostLabels":
        """The labels of the Ray node this code runs on (inside a task or an actor)."""
        import ray

        return cls.from_labels(ray.get_runtime_context().get_node_labels())
