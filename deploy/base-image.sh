#!/usr/bin/env bash
# Makes the base image the Dockerfiles build FROM, on a machine with no registry: when
# the image is missing, Debian bookworm (minbase) is bootstrapped into a directory with
# debootstrap and imported with `docker import`. Nothing is pulled. Idempotent: an
# existing image is left as it is (remove it to make it anew).
#
#   deploy/base-image.sh [IMAGE]        # default: millrace/base:bookworm
#
# Needs root (debootstrap, and apt-get when debootstrap is missing) and a Docker daemon.
# MILLRACE_DEBIAN_MIRROR picks the mirror (default: this host's apt mirror, else
# http://deb.debian.org/debian). Users with a registry need none of this: the
# Dockerfiles default to BASE=debian:bookworm-slim.
set -euo pipefail
image="${1:-millrace/base:bookworm}"

if docker image inspect "$image" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "base-image: installing debootstrap with apt-get" >&2
    apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
fi

# This host's Debian mirror (deb822 or one-line sources), so the bootstrap goes where
# apt already goes.
host_mirror() {
    grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
        grep -v security | sed -E 's/^URIs: *//; s/^deb (\[[^]]*\] )?//' | awk '{print $1}' |
        grep -E '/debian/?$' | head -n1 || true
}
mirror="${MILLRACE_DEBIAN_MIRROR:-$(host_mirror)}"
mirror="${mirror:-http://deb.debian.org/debian}"

dir="$(mktemp -d "${TMPDIR:-/tmp}/millrace-base.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
echo "base-image: bootstrapping Debian bookworm (minbase) from $mirror (about a minute)" >&2
start=$SECONDS
log="$dir.log"
trap 'rm -rf "$dir" "$log"' EXIT
debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$log" 2>&1 || {
    tail -n 20 "$log" >&2
    echo "base-image: debootstrap failed (log above)" >&2
    exit 1
}
# What an image needs no more of: apt's downloaded packages and lists, docs.
rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
    "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/locale/*
# The image's apt uses the same mirror as its bootstrap.
echo "deb $mirror bookworm main" >"$dir/etc/apt/sources.list"
tar -C "$dir" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    --message "Debian bookworm minbase from $mirror (deploy/base-image.sh)" \
    - "$image" >/dev/null
echo "base-image: $image made in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))" >&2
