#!/usr/bin/env bash
# Build the iRPE kernels library and, where TensorRT headers are found, the TensorRT plugins.
#
#   plugins/build.sh [BUILD_DIR] [extra cmake args...]     (default BUILD_DIR: build/plugins)
#
# Two runtimes (TRT=...), one plugin build per TensorRT major version (the ABI differs):
#   TRT=tensorrt      (default) link libnvinfer: TensorRT 10.x or 11.x, headers of that same
#                     version: NGC image (found without settings) or TENSORRT_ROOT=/opt/tensorrt
#   TRT=tensorrt_rtx  link TensorRT-RTX's libtensorrt_rtx.so.1 (pip tensorrt-rtx-cu13-libs; its
#                     folder is found through python, or give TENSORRT_LIBRARY_DIR) with TensorRT
#                     11.x headers; TensorRT-RTX 1.x reports major 1 and has the 11.x layout
#   TRT=tensorrt_rtx TENSORRT_ROOT=../shared/third_party/tensorrt-11.1 plugins/build.sh  # CI
#   plugins/build.sh build/plugins -DIRPE_REQUIRE_TENSORRT=ON   # fail when TensorRT is missing
#   plugins/build.sh build/plugins -DCMAKE_CUDA_ARCHITECTURES=90   # one architecture only
#
# In the NGC TensorRT image the headers are in /usr/include/x86_64-linux-gnu and found without
# TENSORRT_ROOT. The pip wheels (tensorrt, tensorrt-rtx) ship no C++ headers: without
# TENSORRT_ROOT this falls back to ../shared/third_party/tensorrt-11.1 beside the checkout (CI's
# copy), else builds only libirpe_kernels.so and says that the plugins were skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build/plugins}"
shift || true

command -v cmake >/dev/null || { echo "build.sh: cmake not found" >&2; exit 2; }
if ! command -v nvcc >/dev/null && [ ! -x "${CUDACXX:-/usr/local/cuda/bin/nvcc}" ]; then
  echo "build.sh: nvcc not found (install the CUDA toolkit or set CUDACXX)" >&2
  exit 2
fi
export CUDACXX="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"

shared_headers="$here/../../shared/third_party/tensorrt-11.1"
if [ -z "${TENSORRT_ROOT:-}" ] && [ ! -f /usr/include/x86_64-linux-gnu/NvInferRuntime.h ] &&
    [ -f "$shared_headers/include/NvInferRuntime.h" ]; then
  export TENSORRT_ROOT="$(cd "$shared_headers" && pwd)"
  echo "build.sh: using the TensorRT headers in $TENSORRT_ROOT"
fi
runtime_args=()
case "${TRT:-tensorrt}" in
  tensorrt) ;;
  tensorrt_rtx)
    runtime_args+=(-DIRPE_TRT_LIBRARY_NAME=tensorrt_rtx)
    if [ -z "${TENSORRT_LIBRARY_DIR:-}" ]; then
      py="${PYTHON:-$(command -v python3 || true)}"
      [ -x "$here/../.venv/bin/python" ] && py="${PYTHON:-$here/../.venv/bin/python}"
      TENSORRT_LIBRARY_DIR="$("$py" -c 'import tensorrt_rtx_libs as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
    fi
    [ -n "${TENSORRT_LIBRARY_DIR:-}" ] && runtime_args+=(-DTENSORRT_LIBRARY_DIR="$TENSORRT_LIBRARY_DIR")
    ;;
  *) echo "build.sh: TRT must be tensorrt or tensorrt_rtx, got '$TRT'" >&2; exit 2 ;;
esac

cmake -S "$here" -B "$build" "${runtime_args[@]}" "$@"
cmake --build "$build" -j "$(nproc)"

echo
echo "built in $build:"
for lib in libirpe_kernels.so libirpe_trt_plugins.so libirpe_trt_plugins_static.so; do
  if [ -f "$build/$lib" ]; then
    echo "  $lib"
  else
    echo "  $lib: NOT BUILT"
  fi
done
if [ ! -f "$build/libirpe_trt_plugins.so" ]; then
  echo "TensorRT headers were not found, so the TensorRT plugins were not built (see the CMake"
  echo "warning above). Build inside the NGC TensorRT image or set TENSORRT_ROOT."
else
  echo "Load libirpe_trt_plugins.so only into the TensorRT major it was built for (it refuses"
  echo "others); rebuild it for each TensorRT major version."
fi
