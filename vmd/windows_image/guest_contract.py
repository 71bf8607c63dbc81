"""Moved to vmd/guests/windows_contract.py: the contract is the Windows backend's, and its
being here made vmd.guests import vmd.windows_image, which imports vmd.machines, which
imports vmd.guests. Kept as an alias for code written against the old place; import the
new one."""

from vmd.guests.windows_contract import *  # noqa: F401,F403
