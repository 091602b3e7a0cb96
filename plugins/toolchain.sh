# Sourced by the plugin build scripts (plugins/onnxruntime/build.sh, plugins/openvino/build.sh):
# their arguments, and why no C++ build can run here.

# build_args DEFAULT_BUILD_DIR "$@": the scripts' [--optional] [BUILD_DIR] [extra cmake args...]
# into optional (0 or 1), build (CMake's tree) and cmake_args (an array).
build_args() {
  local default="$1"
  shift
  optional=0
  if [ "${1:-}" = --optional ]; then optional=1; shift; fi
  build="${1:-$default}"
  shift || true
  cmake_args=("$@")
}

# Why no C++ build can run here, or nothing when cmake and a compiler (CXX, c++, g++ or
# clang++) are found.
toolchain_missing() {
  command -v cmake >/dev/null || { echo "cmake not found"; return; }
  if [ -n "${CXX:-}" ]; then
    command -v "${CXX%% *}" >/dev/null || echo "C++ compiler CXX=$CXX not found"
  elif ! command -v c++ >/dev/null && ! command -v g++ >/dev/null &&
      ! command -v clang++ >/dev/null; then
    echo "no C++ compiler (c++, g++ or clang++; or set CXX)"
  fi
}
