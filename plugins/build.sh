#!/usr/bin/env bash
# Build the iRPE kernels library and, where TensorRT is installed, the TensorRT plugins.
#
#   plugins/build.sh [BUILD_DIR] [extra cmake args...]     (default BUILD_DIR: build/plugins)
#   TENSORRT_ROOT=/opt/tensorrt plugins/build.sh             # a tar/deb TensorRT install
#   plugins/build.sh build/plugins -DIRPE_REQUIRE_TENSORRT=ON   # fail when TensorRT is missing
#   plugins/build.sh build/plugins -DCMAKE_CUDA_ARCHITECTURES=90   # one architecture only
#
# In the NGC TensorRT image the headers are in /usr/include/x86_64-linux-gnu and found without
# TENSORRT_ROOT. The pip wheels (tensorrt, tensorrt-rtx) ship no C++ headers: on machines that
# only have those, this builds libirpe_kernels.so and says that the plugins were skipped.
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

cmake -S "$here" -B "$build" "$@"
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
fi
