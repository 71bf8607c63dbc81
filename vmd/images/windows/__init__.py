"""The Windows guest image, built from the user's own install ISO (never downloaded).

- what the built guest promises its backend (the launcher task, the share letter, the shell,
  the ready marker) is the backend's: vmd/guests/windows/contract.py.
- `editions`: the editions in the ISO's install.wim / install.esd (the WIM's XML metadata).
- `answer_file`: Autounattend.xml from typed pieces.
- `firstlogon.ps1`: what the guest runs at its first logon (OpenSSH, key, firewall, ...).
- `seed`: the second CD (answer file, $WinPEDriver$, $OEM$) written without root.
- `boot_medium`: the install CD that boots Setup without a key (a qcow2 layer over the ISO).
- `install_domain`: the install machine, the image's own device set (vmd/machines/device_set.py)
  plus its two CDs.
- `install`, `install_watch`: the install boot, watched on COM1 until the guest is ready (or
  said where it stopped), and the compressed base image.
- `build`: `vmd images build windows`, its steps and its manifest.
"""
