#!/usr/bin/env bash
# Build the iRPE OpenVINO extension library into build/plugins/libirpe_openvino.so.
#
#   plugins/openvino/build.sh [--optional] [BUILD_DIR] [extra cmake args...]
#
# Headers and CMake config: the installed openvino wheel's (openvino/include, openvino/cmake),
# found through $PYTHON (default: the checkout's .venv/bin/python, else python3); nothing else
# is needed but cmake and a C++ compiler. BUILD_DIR (CMake's tree) defaults to
# build/plugins/ov; the library goes to $IRPE_OV_OUTPUT_DIR (default build/plugins).
# --optional (make ov-ops, make run): without openvino, cmake or a C++ compiler print one line
# saying why and exit 0.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../toolchain.sh
. "$here/../toolchain.sh"
build_args "$repo/build/plugins/ov" "$@"
out="${IRPE_OV_OUTPUT_DIR:-$repo/build/plugins}"
python="${PYTHON:-}"
[ -n "$python" ] || { [ -x "$repo/.venv/bin/python" ] && python="$repo/.venv/bin/python"; } ||
  python=python3

# The openvino wheel's CMake folder; empty when it is not installed for $python.
ov_cmake() {
  "$python" -c 'import os, openvino; print(os.path.join(os.path.dirname(openvino.__file__), "cmake"))' \
    2>/dev/null || true
}

# Why the library cannot be built here; empty when it can.
why_not() {
  local dir
  dir="$(ov_cmake)"
  [ -n "$dir" ] && [ -f "$dir/OpenVINOConfig.cmake" ] ||
    { echo "the openvino package (with its CMake config) is not installed for $python"; return; }
  toolchain_missing
}

why="$(why_not)"
if [ -n "$why" ]; then
  if [ "$optional" = 1 ]; then
    echo "ov-ops: skipped, $why; OpenVINO runs the iRPE nodes through the frontend conversions"
    exit 0
  fi
  echo "build.sh: $why" >&2
  exit 2
fi
cmake -S "$here" -B "$build" -DOpenVINO_DIR="$(ov_cmake)" -DIRPE_OV_OUTPUT_DIR="$out" \
  "${cmake_args[@]}" >/dev/null
unset MAKEFLAGS MFLAGS MAKELEVEL  # under make ov-ops: CMake's make prints no directory lines
cmake --build "$build" -j "$(nproc)" >/dev/null
touch "$out/libirpe_openvino.so"  # newer than its sources even when CMake had nothing to do
echo "built: $out/libirpe_openvino.so"
