"""The guest a session drives, one folder per OS behind one interface:

- guest.py: the interface every OS implements (`Guest`: run, files, the OS verbs, and what
  the machine asks of its guest), its values (`GuestFacts`, `CommandResult`, ...) and
  `GuestError`, the only error a guest raises;
- families.py: which class drives an image, by its manifest's `os_family` (`guest_class`);
- linux/: `LinuxGuest`, bash over SSH through vmd's command runner;
- windows/: `WindowsGuest`, PowerShell 5.1 over Windows' OpenSSH, and what a built Windows
  image promises it (windows/contract.py);
- ssh.py, output.py: what both stand on: the SSH connection, every request bounded in time,
  and a command's output kept within bounds.

A new OS is a folder here beside linux/ and windows/, and its row in families.py. Nothing
here imports the machines, the images, the sessions or the server (tests/project/test_layering.py).
"""
