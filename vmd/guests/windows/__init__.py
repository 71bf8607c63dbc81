"""A Windows guest: `WindowsGuest` (guest.py), Windows' OpenSSH with PowerShell 5.1 as its
shell, each command one exec, files over SFTP with Windows paths (paths.py); its OS commands
(verbs.py `WindowsVerbs`: launch_app and the window list through the image's session task);
every script a template filled only with integers and quoted strings (scripts.py,
powershell.py); and what a built Windows image promises this backend (contract.py: the
launcher task, the share and its letter, the shell, the ready marker), which the image's
build (vmd/images/windows/) writes into the guest."""
