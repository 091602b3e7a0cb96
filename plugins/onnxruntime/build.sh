#!/usr/bin/env bash
# Build the ONNX Runtime custom-op library (CPU EP; no CUDA needed) into build/plugins/.
#
#   plugins/onnxruntime/build.sh [BUILD_DIR] [extra cmake args...]   (default build/plugins/ort)
#   ORT_ROOT=/opt/onnxruntime-linux-x64-1.23.2 plugins/onnxruntime/build.sh
#
# Headers: ORT_ROOT / ONNXRUNTIME_ROOT (a release archive, or /usr with libonnxruntime-dev),
# else ../shared/third_party/onnxruntime-1.23 beside the checkout. The CUDA EP variant
# (libirpe_ort_ops_cuda.so) is built by plugins/build.sh, with the CUDA kernels.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${1:-$repo/build/plugins/ort}"
shift || true
command -v cmake >/dev/null || { echo "build.sh: cmake not found" >&2; exit 2; }
cmake -S "$here" -B "$build" -DIRPE_REQUIRE_ORT=ON -DIRPE_ORT_OUTPUT_DIR="$repo/build/plugins" "$@"
cmake --build "$build" -j "$(nproc)"
echo "built: $repo/build/plugins/libirpe_ort_ops.so"
