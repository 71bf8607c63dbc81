"""What a built Windows guest promises the backend that drives it (vmd/guests/windows/guest.py).

The image build writes these into the guest (firstlogon.ps1 gets them as arguments from the
answer file); the backend imports them from here, so the two cannot drift apart.
"""

from __future__ import annotations

# The local administrator vmd logs in as over SSH (and who is logged on at the desktop).
ADMIN_USER = "agent"
# sshd's DefaultShell (HKLM:\SOFTWARE\OpenSSH): commands arrive at Windows PowerShell 5.1,
# not cmd.exe, so the backend sends `powershell -EncodedCommand` lines to PowerShell itself.
DEFAULT_SHELL = r"C:\Windows\System32\WindowsPowerShell\v1.0\powershell.exe"
DEFAULT_SHELL_KIND = "powershell"
# A scheduled task that runs in the logged-on user's interactive session: sshd runs in
# session 0, where no window is ever seen, so GUI programs are started by writing the
# command line to LAUNCH_REQUEST and running this task (schtasks /run /tn vmd-launch).
VMD_LAUNCH_TASK = "vmd-launch"
# The task runs what this file names: one line, the program and its arguments.
LAUNCH_REQUEST = r"C:\vmd\launch.txt"
# The project folder: the host's SMB share, at 10.0.2.4 (the address QEMU's user network
# gives its smb= server, reachable only by that guest), mapped at every logon as this drive.
SHARE_NAME = "project"
SHARE_UNC = rf"\\10.0.2.4\{SHARE_NAME}"
SHARE_LETTER = "Z:"
PROJECT_PATH = "Z:\\"
# Where the image's own files live in the guest ($OEM$\$1\vmd on the seed lands here).
GUEST_VMD_DIR = r"C:\vmd"
# firstlogon.ps1 writes this line to COM1 when everything above is in place; the build
# waits for it on the serial log, and the backend may wait for it after a boot.
READY_MARKER = "VMD-READY"
# ...and this one, after `vmd: `, when it failed (firstlogon.ps1, or the first logon command
# of the answer file when the script never ran), with what failed after it.
FAILED_MARKER = "firstlogon failed"
# Volume label of the seed CD: firstlogon.ps1 is found by it if $OEM$ was not copied.
SEED_LABEL = "VMDSEED"
