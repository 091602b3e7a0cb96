#!/usr/bin/env bash
# Build the ONNX Runtime custom-op library (CPU EP; no CUDA needed) into build/plugins/.
#
#   plugins/onnxruntime/build.sh [--optional] [BUILD_DIR] [extra cmake args...]
#   ORT_ROOT=/opt/onnxruntime-linux-x64-1.23.2 plugins/onnxruntime/build.sh
#
# Headers: ORT_ROOT / ONNXRUNTIME_ROOT (a release archive, or /usr with libonnxruntime-dev),
# else $IRPE_SHARED/third_party/onnxruntime-1.23 (default IRPE_SHARED: ../shared beside the
# checkout). BUILD_DIR (CMake's tree) defaults to build/plugins/ort; the library goes to
# $IRPE_ORT_OUTPUT_DIR (default build/plugins). --optional (make ort-ops, scripts/install.sh):
# without headers, cmake or a C++ compiler print one line saying why and exit 0. The CUDA EP
# variant (libirpe_ort_ops_cuda.so) is built by plugins/build.sh, with the CUDA kernels.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../toolchain.sh
. "$here/../toolchain.sh"
build_args "$repo/build/plugins/ort" "$@"
out="${IRPE_ORT_OUTPUT_DIR:-$repo/build/plugins}"

# The first of ORT_ROOT, ONNXRUNTIME_ROOT, the shared copy that has onnxruntime_cxx_api.h.
ort_headers() {
  local root sub
  for root in "${ORT_ROOT:-}" "${ONNXRUNTIME_ROOT:-}" \
      "${IRPE_SHARED:-$repo/../shared}/third_party/onnxruntime-1.23"; do
    [ -n "$root" ] || continue
    for sub in include include/onnxruntime include/onnxruntime/core/session; do
      [ -f "$root/$sub/onnxruntime_cxx_api.h" ] && { (cd "$root" && pwd); return 0; }
    done
  done
  return 1
}

# Why the library cannot be built here; empty when it can.
why_not() {
  ort_headers >/dev/null || {
    echo "ONNX Runtime C/C++ headers not found (set ORT_ROOT to an ONNX Runtime release or to /usr with libonnxruntime-dev)"
    return; }
  toolchain_missing
}

why="$(why_not)"
if [ -n "$why" ] && [ "$optional" = 1 ]; then
  echo "ort-ops: skipped, $why; the server runs the iRPE nodes through the ONNX functions"
  exit 0
fi
command -v cmake >/dev/null || { echo "build.sh: cmake not found" >&2; exit 2; }
headers=()  # none found: CMake searches itself and fails with its message
root="$(ort_headers)" && headers=(-DORT_ROOT="$root")
cmake -S "$here" -B "$build" -DIRPE_REQUIRE_ORT=ON -DIRPE_ORT_OUTPUT_DIR="$out" \
  "${headers[@]}" "${cmake_args[@]}"
unset MAKEFLAGS MFLAGS MAKELEVEL  # under make ort-ops: CMake's make prints no directory lines
cmake --build "$build" -j "$(nproc)"
touch "$out/libirpe_ort_ops.so"  # newer than its sources even when CMake had nothing to do (make)
echo "built: $out/libirpe_ort_ops.so, $out/libirpe_cpu_attention.so"
