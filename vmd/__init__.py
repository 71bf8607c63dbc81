"""vmd: the privileged supervisor of the agent's guests. Its rooms, each a floor above the
ones it uses:

- contract/: the contract with its clients (params, results, policy, the check, the verdict,
  bounds, error codes, shown text, JSON depth): the only part of vmd that vmagent imports;
- config/: every setting a person may tune, with its reason;
- guests/: the guest a session drives, one folder per OS (linux/, windows/) behind one
  interface;
- projects/: the project folder, vmd's own repository of it, and its publication to Gitea;
- machines/: what a session runs on: the machine port and its libvirt implementation,
  images, the warm pool, the screen, the egress guard;
- images/: the guest images' recipes, one folder per image (debian/, ubuntu/, windows/), and
  `vmd images build`;
- session/: one session (its state, boot, record, report, the check vmd re-runs) and the
  verb handlers;
- server/: vmd as a process: the socket server, the command line, the doctor, what runs
  beside the sessions.

Below them: errors.py (how vmd fails), host_env.py (the environment of every host
subprocess), private_fs.py (vmd's files private whatever the umask). No room imports one
that imports it back (tests/project/test_layering.py).
"""
