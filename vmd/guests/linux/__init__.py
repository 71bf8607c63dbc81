"""A Linux guest: `LinuxGuest` (guest.py), commands through the command runner or one exec
channel each, files over SFTP; its OS commands (verbs.py `LinuxVerbs`: the verbs, the facts
script, the X probe, the share's mount, the reboot, the identity reset); the window list read
from X11 (x11_windows.py); the command runner's host end (runner_link.py) and the runner
itself (in_guest/runner.py), shipped into the guest as package data, never imported on the
host."""
