#!/usr/bin/env bash
# A Debian base image made here, for hosts that cannot pull images from a registry (CI):
# debootstrap from the host's own apt mirror, then `docker import`. The project's
# Dockerfiles take it as their BASE build argument instead of the public debian:12-slim.
#
#   docker/ci/build-base.sh        # prints the image's tag, e.g. vmagent-base:1a2b3c4d5e6f
#
# The root filesystem is cached outside the clone, $VMAGENT_CACHE_DIR/docker-base-<hash>.tar
# (default /var/cache/vmagent), named by a hash of its recipe (this file, the suite and the
# mirror): a second run imports the cached tarball (seconds) or finds the image already
# there (nothing), a changed recipe builds a new one. Needs root (debootstrap, chroot).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "build-base.sh needs root (debootstrap and chroot): run it with sudo" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-base.sh needs debootstrap: apt-get install debootstrap" >&2; exit 1; }

# The mirror and suite come from the host's apt configuration (as vmd/images/debian/build.sh
# reads them), so the recipe names no host.
mirror=${VMD_APT_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
    | awk '$3 == "main" && $2 !~ /-/ {print $1; exit}')}
suite=${VMD_APT_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME}")}
[ -n "$mirror" ] || { echo "no Debian mirror found in the host's apt sources (run apt-get update, or set VMD_APT_MIRROR)" >&2; exit 1; }

cache=${VMAGENT_CACHE_DIR:-/var/cache/vmagent}
# The host's own certificate authorities (/usr/local/share/ca-certificates: a company's,
# or a proxy's in front of PyPI) go into the base, so that what builds on it trusts what
# this host trusts; the images' ca-certificates package adds them to the system bundle.
local_cas=/usr/local/share/ca-certificates
hash=$( { cat "$0"; echo "$suite $mirror"; cat "$local_cas"/* 2>/dev/null || true; } | sha256sum | cut -c1-12)
tag=vmagent-base:$hash
tarball=$cache/docker-base-$hash.tar

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/vmagent-base.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    started=$(date +%s)
    # minbase: what debian:12-slim holds (apt, dpkg, coreutils); the Dockerfiles add the rest.
    debootstrap --variant=minbase "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; echo "debootstrap of $suite from the host's mirror failed" >&2; exit 1; }
    if [ -d "$local_cas" ]; then
        mkdir -p "$work/root$local_cas"
        cp -a "$local_cas/." "$work/root$local_cas/"
    fi
    # As the official slim images: no cached package lists or .debs, no docs to keep.
    chroot "$work/root" apt-get clean
    rm -rf "$work/root"/var/lib/apt/lists/* "$work/root"/var/cache/apt/*.bin "$work/root"/tmp/*
    tar -C "$work/root" --numeric-owner -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    echo "build-base.sh: $tarball built in $(( $(date +%s) - started )) s" >&2
fi
docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$tag" >/dev/null
echo "$tag"
