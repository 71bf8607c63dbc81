"""What the real-guest tests share about the guests they make: finding a test's own
domains and making sure none outlives it. A test's domains are those whose files lie
under a marker path (its tmp or work folder), so tests running side by side, or a CI run
beside a developer's, never touch each other's guests."""

from __future__ import annotations

import time


def domains_of(conn, marker: str) -> list[str]:
    """This test's domains (defined or running): those whose files lie under `marker`."""
    import libvirt

    names = []
    for domain in conn.listAllDomains():
        try:
            if domain.name().startswith("vmagent-") and marker in domain.XMLDesc(0):
                names.append(domain.name())
        except libvirt.libvirtError:
            continue  # undefined while we looked
    return names


def clean_up_domains(conn, marker: str) -> None:
    """A failed test must not leave a guest running: destroy the ones made under `marker`."""
    import libvirt

    for domain in conn.listAllDomains():
        try:
            if not domain.name().startswith("vmagent-") or marker not in domain.XMLDesc(0):
                continue
            if domain.isActive():
                domain.destroy()
            domain.undefine()
        except libvirt.libvirtError:
            pass


def wait_for(predicate, timeout: float = 15, what: str = "the condition", poll: float = 0.5):
    """The predicate's first true value within `timeout` s, else an AssertionError naming `what`.
    `poll`: half a second suits a guest; tests with stand-in machines look more often."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
