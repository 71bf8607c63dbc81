"""Which `Guest` class drives an image: the image manifest's `os_family` picks it. A new
OS is a class of `Guest` (vmd/guests/guest.py) and its row here."""

from __future__ import annotations

from vmd.guests.guest import Guest, GuestError
from vmd.guests.linux.guest import LinuxGuest
from vmd.guests.windows.guest import WindowsGuest

GUESTS: dict[str, type[Guest]] = {"linux": LinuxGuest, "windows": WindowsGuest}


def guest_class(os_family: str) -> type[Guest]:
    try:
        return GUESTS[os_family]
    except KeyError:
        raise GuestError(f"this vmd drives {', '.join(sorted(GUESTS))} guests; no guest class is written for "
                         f"{os_family!r} images yet (vmd/guests/families.py).") from None
