#!/usr/bin/env bash
# The Debian packages the local stack and the tests need: sshd for the host slots, HAProxy as the
# balancer, socat for its admin socket, redis-server for the gateway's shared quota store, the AWS CLI that the host bootstrap calls (tested against moto). Installs what is missing when run as root with apt-get;
# otherwise says what to install and fails.
set -euo pipefail
# g++ builds the runtime's native CPU kernels at install; the aarch64 cross compiler checks that their
# portable variant compiles for Arm hosts.
packages=(openssh-server openssh-client haproxy socat redis-server g++ g++-aarch64-linux-gnu)
# The runtime image's test: podman with runc (crun cannot run here), buildah, uidmap, and debootstrap
# for the base built from Debian's packages (scripts/build-debian-base.sh).
packages+=(podman buildah runc uidmap debootstrap)
# promtool (Debian's prometheus package; its server is not started here) evaluates the rendered
# alerting rules over synthetic series in the tests.
packages+=(prometheus)
# The host bootstrap shells out to `aws`; the tests run it against moto. Any aws on PATH will do.
command -v aws >/dev/null 2>&1 || packages+=(awscli)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -ne 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing Debian packages: ${missing[*]} (install them: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The IAM simulator the e2e tests evaluate the local stack's call log with (conditions included):
# @cloud-copilot/iam-simulate, pinned by tools/iam-simulate/package-lock.json. Node 18+ and npm.
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is missing: install Node.js 18+ with npm (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
tool="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/iam-simulate"
lock=$tool/package-lock.json
stamp=$tool/node_modules/.package-lock.json
if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
  (cd "$tool" && npm ci --no-audit --no-fund --silent)
fi
