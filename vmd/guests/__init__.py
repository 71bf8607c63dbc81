"""The guest: one class per OS that runs commands and moves files (`Guest`, guest.py),
the SSH connection it runs over (ssh.py), and the command runner's host end
(runner_link.py); in_guest/ holds what is shipped into the guest, data here, never
imported on the host."""
