#!/usr/bin/env bash
# Install irpe-deploy for serving. The Docker image runs exactly this; CI runs it as well.
#
#   scripts/install.sh                       # CPU: torch, the project with serve + export + openvino
#   VARIANT=gpu scripts/install.sh           # NGC TensorRT image: + onnxruntime-gpu, plugin library
#   VENV=.venv-serve EDITABLE=1 scripts/install.sh   # into a fresh virtual env, editable
#   VENV=/opt/venv WHEELHOUSE=wheelhouse scripts/install.sh   # offline (scripts/docker-wheelhouse.sh)
#
# Environment (all optional):
#   VARIANT          cpu | gpu                                   (default cpu)
#   PYTHON           interpreter                                 (default python3)
#   VENV             create / reuse this virtual env and install there (default: PYTHON's env;
#                    one whose Python is marked externally managed, PEP 668, refuses pip: use
#                    a VENV). gpu: made with --system-site-packages, so the TensorRT and CUDA
#                    Python packages of the NGC base are used, not downloaded again
#   WHEELHOUSE       folder of wheels: install only from there (pip --no-index), no network
#   TORCH            torch requirement                           (default torch==2.13.0)
#   TORCH_INDEX_URL  index for torch only, e.g. https://download.pytorch.org/whl/cpu
#   EDITABLE         1: pip install -e (development, CI)         (default 0)
#   PLUGIN_BUILD     build folder of the TensorRT plugins (gpu)  (default build/plugins)
#   ORT_ROOT         ONNX Runtime C/C++ headers (release archive, /usr with libonnxruntime-dev):
#                    builds the iRPE ORT custom-op library into build/plugins (cpu; gpu: in
#                    PLUGIN_BUILD with the CUDA EP); without headers, cmake or a C++ compiler
#                    one "ort-ops: skipped" line and the server runs the files' ONNX functions
#                    (cpu: the iRPE OpenVINO library is built too, from the openvino wheel's
#                    headers, where cmake and a C++ compiler are found; else "ov-ops: skipped")
#   BAKE_DEMO        1: export + warm up the demo models now, into $IRPE_CACHE (default 1)
#   DEPS_ONLY        1: torch and the project's dependencies only (scripts/requirements.py,
#                    Python >= 3.11), not the project: the image's layer that survives source edits
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT="${VARIANT:-cpu}"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
PLUGIN_BUILD="${PLUGIN_BUILD:-build/plugins}"
BAKE_DEMO="${BAKE_DEMO:-1}"

step() { echo "==> install.sh: $*"; }
fail() { echo "install.sh: error: $*" >&2; exit 2; }
# A built custom-op library must load into the installed onnxruntime (else: fail now, not at serve).
ort_ops_check() {
  [ -f "$ort_ops" ] || return 0
  "$PYTHON" -c 'import sys, onnxruntime as ort; ort.SessionOptions().register_custom_ops_library(sys.argv[1])' "$ort_ops" ||
    fail "$ort_ops does not load into onnxruntime"
}

# VARIANT=gpu builds the TensorRT plugin library: fail before any download when CUDA / TensorRT
# are missing (any base but the NGC TensorRT image), naming what is missing.
gpu_preflight() {
  local missing=() trt
  command -v nvcc >/dev/null || [ -x "${CUDACXX:-/usr/local/cuda/bin/nvcc}" ] ||
    missing+=("nvcc (CUDA toolkit)")
  command -v cmake >/dev/null || missing+=("cmake")
  trt=no
  for header in "${TENSORRT_ROOT:-/nonexistent}/include/NvInferRuntime.h" \
      /usr/include/x86_64-linux-gnu/NvInferRuntime.h /usr/include/NvInferRuntime.h; do
    [ -f "$header" ] && trt=yes
  done
  [ "$trt" = yes ] || missing+=("TensorRT C++ headers (NvInferRuntime.h; or set TENSORRT_ROOT)")
  [ ${#missing[@]} = 0 ] && return 0
  fail "VARIANT=gpu needs CUDA and TensorRT (plugin library, onnxruntime-gpu); missing: $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g'). Build it on the NGC TensorRT image (the Dockerfile's GPU_BASE) or use VARIANT=cpu"
}

case "$VARIANT" in cpu|gpu) ;; *) fail "VARIANT must be cpu or gpu, got '$VARIANT'";; esac
[ "$VARIANT" = gpu ] && gpu_preflight
if [ -n "${VENV:-}" ]; then
  venv_args=()
  [ "$VARIANT" = gpu ] && venv_args=(--system-site-packages)
  [ -x "$VENV/bin/python" ] || { step "virtual env $VENV ${venv_args[*]:-}"; "$PYTHON" -m venv "${venv_args[@]}" "$VENV"; }
  PYTHON="$VENV/bin/python"
fi
PIP=("$PYTHON" -m pip install --no-input)
if [ -n "${WHEELHOUSE:-}" ]; then
  ls "$WHEELHOUSE"/*.whl >/dev/null 2>&1 || fail "WHEELHOUSE=$WHEELHOUSE has no wheels (scripts/docker-wheelhouse.sh makes it)"
  PIP+=(--no-index --find-links "$WHEELHOUSE")
  TORCH_INDEX_URL=
  step "offline: every package from $WHEELHOUSE"
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail "Python >= 3.10 needed"

step "torch ($TORCH${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL})"
"${PIP[@]}" "$TORCH" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

# onnxruntime and onnxruntime-gpu must not be installed together: the gpu variant takes the
# gpu extra (onnxruntime-gpu, tensorrt, cuda-python) plus onnx instead of the export extra
# (scripts/requirements.py lists the same per variant for DEPS_ONLY and the wheelhouse).
if [ "$VARIANT" = gpu ]; then extras="serve,gpu"; extra_reqs=("onnx>=1.16"); else
  extras="serve,export,openvino"; extra_reqs=(); fi
if [ "${DEPS_ONLY:-0}" = 1 ]; then
  step "dependencies of [$extras] ${extra_reqs[*]:-}, not the project"
  mapfile -t deps < <("$PYTHON" scripts/requirements.py "$VARIANT")
  [ ${#deps[@]} -gt 0 ] || fail "scripts/requirements.py listed nothing (Python >= 3.11 needed for DEPS_ONLY)"
  "${PIP[@]}" "${deps[@]}"
  step "done (dependencies only)"
  exit 0
fi
target="."
[ "${EDITABLE:-0}" = 1 ] && target="-e ."
step "project [$extras] ${extra_reqs[*]:-}"
# shellcheck disable=SC2086  # $target is "." or "-e ."
"${PIP[@]}" $target"[$extras]" "${extra_reqs[@]}"

if [ "$VARIANT" = gpu ]; then
  step "TensorRT plugin library (+ ORT custom ops where ORT_ROOT has headers) -> $PLUGIN_BUILD"
  plugins/build.sh "$PLUGIN_BUILD" -DIRPE_REQUIRE_TENSORRT=ON
  ort_ops="$PLUGIN_BUILD/libirpe_ort_ops_cuda.so"
  [ -f "$ort_ops" ] || echo "ort-ops: skipped, ONNX Runtime C/C++ headers not found (set ORT_ROOT); the server runs the iRPE nodes through the ONNX functions"
else
  step "ONNX Runtime custom-op library -> build/plugins"
  plugins/onnxruntime/build.sh --optional
  ort_ops=build/plugins/libirpe_ort_ops.so
fi
ort_ops_check
if [ -f "$ort_ops" ] && [ -z "${IRPE_ORT_OPS_LIBRARY:-}" ]; then
  # an installed (non-editable) project looks in site-packages, not here: name the file
  IRPE_ORT_OPS_LIBRARY="$(cd "$(dirname "$ort_ops")" && pwd)/${ort_ops##*/}"
  export IRPE_ORT_OPS_LIBRARY
  [ "${EDITABLE:-0}" = 1 ] || step "serve it with IRPE_ORT_OPS_LIBRARY=$IRPE_ORT_OPS_LIBRARY"
fi
if [ "$VARIANT" = cpu ]; then
  step "iRPE OpenVINO library -> build/plugins"
  PYTHON="$PYTHON" plugins/openvino/build.sh --optional
  ov_ops=build/plugins/libirpe_openvino.so
  if [ -f "$ov_ops" ]; then
    "$PYTHON" -c 'import sys, openvino as ov; ov.Core().add_extension(sys.argv[1])' "$ov_ops" ||
      fail "$ov_ops does not load into openvino"
    if [ -z "${IRPE_OV_OPS_LIBRARY:-}" ] && [ "${EDITABLE:-0}" != 1 ]; then
      step "serve it with IRPE_OV_OPS_LIBRARY=$(cd "$(dirname "$ov_ops")" && pwd)/${ov_ops##*/}"
    fi
  fi
fi

step "check"
"$PYTHON" -m irpe --version
"$PYTHON" -c 'import serve.app, serve.backends.onnxruntime_backend, onnxruntime as ort; print("serve ok; onnxruntime providers:", ", ".join(ort.get_available_providers()))'

if [ "$BAKE_DEMO" = 1 ]; then
  if ls irpe/demo/*.safetensors >/dev/null 2>&1; then
    step "demo models: ONNX export + warmup (cache: ${IRPE_CACHE:-default})"
    env -u IRPE_SERVE_REPOSITORY -u IRPE_SERVE_MODELS \
      "$PYTHON" -m irpe serve --prepare --log-level warning
  else
    step "demo weights not bundled (irpe/demo/*.safetensors): demo not baked"
  fi
fi
step "done"
