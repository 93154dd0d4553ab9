#!/usr/bin/env bash
# Make this machine able to build and run deploy/: a running Docker engine, docker-compose,
# and the Python base image deploy/Dockerfile builds FROM. Prints that image's name as its
# last line (pass it as `--build-arg PYTHON_IMAGE=...`).
#
#   image=$(bash tools/docker_ready.sh | tail -1)
#
# - Engine: Debian's docker.io is installed if `dockerd` is missing, and started in the
#   background if `docker info` fails (its log: $HERALDPS_DOCKERD_LOG, /tmp/heraldps-dockerd.log).
# - Base image: the real python:3.11-slim-bookworm when it is already here or a registry
#   answers `docker pull` within 60 s. Without a registry (CI here), a Debian bookworm
#   with Debian's Python 3.11 is made with debootstrap and imported as
#   heraldps-base:bookworm; it carries this machine's CA bundle and a pip.conf naming it, so
#   pip inside the build reaches the package index through the same proxy this machine uses.
#   It is a stand-in for the official image, built only where that one cannot be had.
set -euo pipefail

official=${PYTHON_IMAGE:-python:3.11-slim-bookworm}
offline=heraldps-base:bookworm
dockerd_log=${HERALDPS_DOCKERD_LOG:-/tmp/heraldps-dockerd.log}
export DEBIAN_FRONTEND=noninteractive

say() { echo "docker_ready: $*" >&2; }

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
if ((${#need[@]})); then
  say "installing ${need[*]} from Debian"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $dockerd_log)"
  setsid nohup dockerd >"$dockerd_log" 2>&1 </dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { say "dockerd did not start:"; tail -20 "$dockerd_log" >&2; exit 1; }
fi

if docker image inspect "$official" >/dev/null 2>&1; then
  echo "$official"; exit 0
fi
if timeout 60 docker pull -q "$official" >/dev/null 2>&1; then
  say "pulled $official"
  echo "$official"; exit 0
fi
if docker image inspect "$offline" >/dev/null 2>&1; then
  say "no registry; using the debootstrapped $offline made earlier"
  echo "$offline"; exit 0
fi

say "no registry answers: making $offline with debootstrap"
command -v debootstrap >/dev/null || {
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends debootstrap >/dev/null
}
root=$(mktemp -d /tmp/heraldps-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
  bookworm "$root" "$mirror" >/dev/null
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$offline" >/dev/null
say "made $offline"
echo "$offline"
