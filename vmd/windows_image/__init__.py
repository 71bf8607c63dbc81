"""The Windows guest image, built from the user's own install ISO (never downloaded).

- what the built guest promises its backend (the launcher task, the share letter, the shell,
  the ready marker) is the backend's: vmd/guests/windows_contract.py.
- `editions`: the editions in the ISO's install.wim / install.esd (the WIM's XML metadata).
- `answer_file`: Autounattend.xml from typed pieces.
- `firstlogon.ps1`: what the guest runs at its first logon (OpenSSH, key, firewall, ...).
- `seed`: the second CD (answer file, $WinPEDriver$, $OEM$) written without root.
- `install`: the install boot (q35, OVMF, swtpm) and the compressed base image.
- `build`: `vmd images build windows`, its steps and its manifest.
"""
