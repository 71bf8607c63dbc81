"""Guest images: one folder per image, holding its recipe, named as `vmd images build NAME`
and `session_open`'s `os` take it. The one home of what shapes a guest before vmd boots it.

- debian/: the default Linux guest, built from the apt mirror alone (build.sh, packages.txt,
  the files of rootfs/); the image CI builds and caches by its recipe hash;
- ubuntu/: Ubuntu from its cloud image and a NoCloud seed (build.sh, seed.py);
- windows/: the Windows guest from the user's own ISO, built by vmd itself (a Python package:
  its answer file from typed pieces, its first logon script, its seed, the install watched
  on COM1);
- build.py: `vmd images build` for a recipe with a build.sh, and `vmd images list`.

A built image, and which one is current (the recipe hash over every file of a recipe's
folder), is vmd/machines/images.py's: a machine boots it.
"""
