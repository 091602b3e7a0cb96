#!/usr/bin/env bash
# A Python base image made from Debian packages (debootstrap + docker import), for hosts that
# cannot pull python:3.11-slim (no registry: CI, air-gapped sites). Prints the image name.
#
#   BASE="$(scripts/docker-base.sh)"      # e.g. irpe-base:bookworm-3f2a9c1d0e4b
#   docker build --build-arg CPU_BASE="$BASE" ...
#
# The tag is a digest of suite + variant + package list: an image with that tag is reused,
# so the ~2 min debootstrap runs once per package list and engine. Needs root, debootstrap,
# a Debian mirror (MIRROR, else the one apt uses here: /etc/apt/sources.list*) and a docker
# client that reaches an engine ($DOCKER, default docker).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE="${SUITE:-bookworm}"
# python3-venv brings ensurepip (pip for the image's venv); no system pip (PEP 668)
PACKAGES="${PACKAGES:-python3,python3-venv,ca-certificates}"
DOCKER="${DOCKER:-docker}"
say() { echo "docker-base: $*" >&2; }

# The first mirror apt's sources list for $SUITE (deb822 .sources or one-line .list).
apt_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v s="$SUITE" '{ sub(/\[[^]]*\] */, "") } $1 == "deb" && $3 == s { print $2; exit }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v s="$SUITE" 'BEGIN { RS = ""; FS = "\n" } {
        uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, u, " "); uri = u[2] }
          if ($i ~ /^Suites:/) { n = split($i, w, " "); for (k = 2; k <= n; k++) if (w[k] == s) ok = 1 }
        }
        if (ok && uri != "") { print uri; exit } }' "$f"
  done
}

tag="irpe-base:$SUITE-$(printf '%s\n' "$SUITE" minbase "$PACKAGES" | sha256sum | cut -c1-12)"
if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
  say "reusing $tag"
  echo "$tag"; exit 0
fi
command -v debootstrap >/dev/null || { say "error: debootstrap not installed (apt-get install debootstrap)"; exit 2; }
[ "$(id -u)" = 0 ] || { say "error: debootstrap needs root"; exit 2; }
mirror="${MIRROR:-$(apt_mirror | head -n 1)}"
mirror="${mirror:-http://deb.debian.org/debian}"
root="$(mktemp -d "${TMPDIR:-/tmp}/irpe-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
say "debootstrap $SUITE ($PACKAGES) from $mirror -> $tag"
start=$SECONDS
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >"$root.log" 2>&1 ||
  { tail -n 20 "$root.log" >&2; rm -f "$root.log"; say "error: debootstrap failed"; exit 2; }
rm -f "$root.log"
# package archives and lists are not needed in an image (apt-get update refills the lists)
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
tar -C "$root" -c . | "$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE $mirror" - "$tag" >/dev/null
say "made $tag in $((SECONDS - start)) s ($("$DOCKER" image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
echo "$tag"
