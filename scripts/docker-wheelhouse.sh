#!/usr/bin/env bash
# The offline wheelhouse for `docker build`: every wheel the image installs (torch + the project's
# dependencies and extras, setuptools to build the project), downloaded on the host with the
# host's pip configuration (index, certificates), into wheelhouse/ in the build context. The
# Dockerfile then installs from it with --no-index: no network during the build.
#
#   scripts/docker-wheelhouse.sh                               # CPU image (torch==2.13.0, cpu wheel)
#   VARIANT=gpu PYTHON_VERSION=3.12 scripts/docker-wheelhouse.sh   # NGC TensorRT image (Python 3.12)
#
# Environment: VARIANT cpu|gpu (default cpu), TORCH (default torch==2.13.0, as CI),
# TORCH_INDEX_URL (an index for torch only; default pip's configured one, which finds the CPU
# wheel on the development machines; PyPI's Linux torch is the CUDA build, so elsewhere give
# https://download.pytorch.org/whl/cpu for the CPU image: a warning says so), PYTHON_VERSION of the image's interpreter (default 3.11:
# Debian 12, python:3.11-slim), PLATFORM (default manylinux_2_28_x86_64), WHEELHOUSE (default
# wheelhouse), PYTHON (the host interpreter running pip, >= 3.11; default python3). The folder
# is reused while its key (the inputs above + pyproject.toml) is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT="${VARIANT:-cpu}"
TORCH="${TORCH:-torch==2.13.0}"
PYTHON_VERSION="${PYTHON_VERSION:-3.11}"
PLATFORM="${PLATFORM:-manylinux_2_28_x86_64}"
WHEELHOUSE="${WHEELHOUSE:-wheelhouse}"
PYTHON="${PYTHON:-python3}"
say() { echo "docker-wheelhouse: $*" >&2; }
# pip's stderr without the one-line warnings about index folders it skips
quiet() { grep -v "is neither a file nor a directory" || true; }
case "$VARIANT" in cpu|gpu) ;; *) say "error: VARIANT must be cpu or gpu, got '$VARIANT'"; exit 2;; esac

key="$(printf '%s\n' "$VARIANT" "$TORCH" "${TORCH_INDEX_URL:-}" "$PYTHON_VERSION" "$PLATFORM" |
  cat - pyproject.toml scripts/requirements.py | sha256sum | cut -c1-16)"
if [ -f "$WHEELHOUSE/.key" ] && [ "$(cat "$WHEELHOUSE/.key")" = "$key" ]; then
  say "reusing $WHEELHOUSE ($(ls "$WHEELHOUSE" | grep -c '\.whl$') wheels, key $key)"
  exit 0
fi
rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
target=(--only-binary=:all: --python-version "$PYTHON_VERSION" --platform "$PLATFORM"
  --platform manylinux2014_x86_64 --platform linux_x86_64 --implementation cp)
start=$SECONDS
say "$TORCH${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (Python $PYTHON_VERSION, $PLATFORM)"
# shellcheck disable=SC2086  # TORCH may carry pip options, as in the Makefile
"$PYTHON" -m pip download -q --no-deps -d "$WHEELHOUSE" "${target[@]}" $TORCH \
  ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} 2> >(quiet >&2)
reqs="$("$PYTHON" scripts/requirements.py "$VARIANT" --build)"
say "$(echo "$reqs" | wc -l) requirements of the project's [$([ "$VARIANT" = gpu ] && echo serve,gpu || echo serve,export,openvino)] extras, with their dependencies"
# torch's own dependencies resolve with the project's (torch itself is already here)
torch_file="$(ls "$WHEELHOUSE"/torch-*.whl)"
[ "$VARIANT" = gpu ] || [[ "$torch_file" == *+cpu* ]] ||
  say "warning: ${torch_file##*/} is not the CPU build (the CPU image would carry CUDA libraries); TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu gets it"
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q -d "$WHEELHOUSE" "${target[@]}" --find-links "$WHEELHOUSE" \
  "$torch_file" $reqs 2> >(quiet >&2)
echo "$key" > "$WHEELHOUSE/.key"
say "$(ls "$WHEELHOUSE" | grep -c '\.whl$') wheels, $(du -sh "$WHEELHOUSE" | cut -f1) in $WHEELHOUSE ($((SECONDS - start)) s)"
