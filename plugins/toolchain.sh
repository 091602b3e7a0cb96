# Sourced by the plugin build scripts (plugins/onnxruntime/build.sh, plugins/openvino/build.sh):
# why no C++ build can run here, or nothing when cmake and a compiler (CXX, c++, g++ or
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
