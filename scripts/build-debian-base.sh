#!/usr/bin/env bash
# A base image for the CPU variant of runtime/Dockerfile, built from Debian's packages where no
# registry can be pulled from: debootstrap's minbase of bookworm imported into podman as
# localhost/frontier-debian-base:bookworm, and a local apt repository beside it holding every package
# the Dockerfile's stages install with apt (python3 3.11, the same minor as the runtime's venv on the
# hosts; g++ for the first stage; the runtime stage's C compiler and Python headers).
#
#   scripts/build-debian-base.sh            # prints the repository's folder, then the image's name
#                                           # (last, as callers read it); builds them only when missing
#   podman build --build-arg CUDA_IMAGE=localhost/frontier-debian-base:bookworm -v REPO:/debs:ro ...
#
# The base carries python3 (the host boot rehearsal runs the bootstrap on it), python3-venv,
# ca-certificates and passwd, and no compiler and no headers: what the runtime stage needs of those
# it must install itself, as on a CUDA runtime base. Its apt reads one source, the repository
# mounted at /debs, so each `apt-get install` of the Dockerfile runs for real with no network, and a
# package the runtime stage does not name is not in the runtime image, whatever the first stage
# installed.
#
# The packages are the ones named on the Dockerfile's `packages="..."` lines ($DOCKERFILE, default
# runtime/Dockerfile beside this script), downloaded with their dependencies by the base's own apt
# (so exactly what the base lacks), indexed with dpkg-deb.
#
# Built once per machine: the image is labelled with the sha256 of this recipe (this file, the
# mirror and the package list), the repository lives in a folder named by it, and a present pair
# with the same recipe is reused. FORCE=1 rebuilds. Needs root, debootstrap and podman
# (scripts/system-packages.sh installs them).
set -euo pipefail

IMAGE=${FRONTIER_DEBIAN_BASE:-localhost/frontier-debian-base:bookworm}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,passwd
DOCKERFILE=${DOCKERFILE:-$(dirname "$0")/../runtime/Dockerfile}
# Where a build mounts the repository (the base's only apt source).
REPO_MOUNT=/debs
# Every package the Dockerfile's apt steps may install, from its `packages="..."` lines.
REPO_PACKAGES=$(grep -o 'packages="[^"]*"' "$DOCKERFILE" | sed 's/^packages="//; s/"$//' | tr ' ' '\n' | sort -u | tr '\n' ' ')
[ -n "$REPO_PACKAGES" ] || { echo "no packages=\"...\" line in $DOCKERFILE" >&2; exit 1; }

# The mirror apt is configured with here (deb822 first, then the one-line format): debootstrap
# reaches exactly what apt-get reaches, nothing else.
default_mirror() {
  local sources=/etc/apt/sources.list.d/debian.sources
  if [ -r "$sources" ]; then
    awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$sources"
  elif [ -r /etc/apt/sources.list ]; then
    awk '$1 == "deb" && $0 !~ /security/ {print ($2 ~ /^\[/ ? $3 : $2); exit}' /etc/apt/sources.list
  fi
}
MIRROR=${DEBIAN_MIRROR:-$(default_mirror)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

recipe=$( (cat "$0"; echo "$MIRROR"; echo "$REPO_PACKAGES") | sha256sum | cut -c1-16)
REPO=${FRONTIER_DEBIAN_REPO:-/var/tmp/frontier-debian-repo}/$recipe

if [ "${FORCE:-0}" != 1 ] && [ -f "$REPO/Packages" ] && podman image exists "$IMAGE" \
  && [ "$(podman image inspect --format '{{index .Labels "frontier.base.recipe"}}' "$IMAGE")" = "$recipe" ]; then
  echo "$REPO"
  echo "$IMAGE"
  exit 0
fi

for tool in debootstrap podman; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool is missing: run scripts/system-packages.sh" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root (uid 0), running as uid $(id -u)" >&2; exit 1; }

root=$(mktemp -d /var/tmp/frontier-debian-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap --variant=minbase $SUITE from $MIRROR (+ $PACKAGES)" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2

# The repository: what the Dockerfile installs and the base lacks, resolved by the base's own apt
# (from the mirror debootstrap used), then indexed as a flat repository.
echo "apt-get install --download-only $REPO_PACKAGES" >&2
chroot "$root" apt-get update -qq >&2
chroot "$root" apt-get install -y -qq --download-only --no-install-recommends $REPO_PACKAGES >&2
rm -rf "$REPO.partial"
mkdir -p "$REPO.partial"
mv "$root"/var/cache/apt/archives/*.deb "$REPO.partial"/
(
  cd "$REPO.partial"
  for deb in *.deb; do
    dpkg-deb --field "$deb"
    echo "Filename: ./$deb"
    echo "Size: $(stat -c %s "$deb")"
    echo "SHA256: $(sha256sum "$deb" | cut -d' ' -f1)"
    echo
  done >Packages
)
rm -rf "$REPO"
mv "$REPO.partial" "$REPO"

# What an image never reads: the package downloads, apt's lists (the Dockerfile runs apt-get update
# itself when it needs to), documentation, man pages and translations.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
# Later apt installs in derived images skip them too, and install no recommends.
cat >"$root"/etc/dpkg/dpkg.cfg.d/01-frontier-nodoc <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  >"$root"/etc/apt/apt.conf.d/01-frontier-norecommends
# The repository is apt's one source: a build without it mounted cannot install anything.
echo "deb [trusted=yes] file:$REPO_MOUNT ./" >"$root"/etc/apt/sources.list
rm -f "$root"/etc/apt/sources.list.d/*

previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
tar --numeric-owner --xattrs -C "$root" -c . \
  | podman import --change "LABEL frontier.base.recipe=$recipe" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "$IMAGE" >&2
# The base this one replaces, unless images built on it still need it (rmi refuses those).
[ -z "$previous" ] || podman rmi "$previous" >/dev/null 2>&1 || true
# Repositories of earlier recipes.
find "$(dirname "$REPO")" -mindepth 1 -maxdepth 1 -type d ! -name "$recipe" -exec rm -rf {} + 2>/dev/null || true
echo "$REPO"
echo "$IMAGE"
