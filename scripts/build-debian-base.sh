#!/usr/bin/env bash
# A base image for the CPU variant of runtime/Dockerfile, built from Debian's packages where no
# registry can be pulled from: debootstrap's minbase of bookworm (python3.11, the same minor as the
# runtime's venv on the hosts) imported into podman as localhost/frontier-debian-base:bookworm.
#
#   scripts/build-debian-base.sh            # prints the image's name; builds it only when missing
#   podman build --build-arg CUDA_IMAGE=localhost/frontier-debian-base:bookworm ...
#
# It carries everything both stages of the Dockerfile install with apt (python3, python3-venv,
# ca-certificates, g++, passwd), so the image builds with no network: the Dockerfile installs only
# what its base lacks. The CPU variant therefore keeps g++ in its runtime stage; the production
# image's runtime stage (a CUDA runtime base) gets none.
#
# Built once per machine: the image is labelled with the sha256 of this recipe (this file and the
# mirror), and a present image with the same label is reused. FORCE=1 rebuilds. Needs root,
# debootstrap and podman (scripts/system-packages.sh installs them).
set -euo pipefail

IMAGE=${FRONTIER_DEBIAN_BASE:-localhost/frontier-debian-base:bookworm}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,g++,passwd

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

recipe=$( (cat "$0"; echo "$MIRROR") | sha256sum | cut -c1-16)

if [ "${FORCE:-0}" != 1 ] && podman image exists "$IMAGE" \
  && [ "$(podman image inspect --format '{{index .Labels "frontier.base.recipe"}}' "$IMAGE")" = "$recipe" ]; then
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

previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
tar --numeric-owner --xattrs -C "$root" -c . \
  | podman import --change "LABEL frontier.base.recipe=$recipe" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "$IMAGE" >&2
# The base this one replaces, unless images built on it still need it (rmi refuses those).
[ -z "$previous" ] || podman rmi "$previous" >/dev/null 2>&1 || true
echo "$IMAGE"
