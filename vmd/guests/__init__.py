"""The guest: the interface every OS implements (`Guest`, guest.py), one class per OS
(linux.py; its OS commands in os_verbs.py), the class an image's family picks
(families.py), the SSH connection (ssh.py), the command runner's host end
(runner_link.py) and a command's bounded output (output.py); in_guest/ holds what is
shipped into the guest, data here, never imported on the host."""
