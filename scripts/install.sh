#!/usr/bin/env bash
# Install irpe-deploy for serving. The Docker image runs exactly this; CI runs it as well.
#
#   scripts/install.sh                       # CPU: torch, the project with serve + export extras
#   VARIANT=gpu scripts/install.sh           # NGC TensorRT image: + onnxruntime-gpu, plugin library
#   VENV=.venv-serve EDITABLE=1 scripts/install.sh   # into a fresh virtual env, editable
#
# Environment (all optional):
#   VARIANT          cpu | gpu                                   (default cpu)
#   PYTHON           interpreter                                 (default python3)
#   VENV             create / reuse this virtual env and install there (default: PYTHON's env)
#   TORCH            torch requirement                           (default torch==2.13.0)
#   TORCH_INDEX_URL  index for torch only, e.g. https://download.pytorch.org/whl/cpu
#   EDITABLE         1: pip install -e (development, CI)         (default 0)
#   PLUGIN_BUILD     build folder of the TensorRT plugins (gpu)  (default build/plugins)
#   BAKE_DEMO        1: export + warm up the demo models now, into $IRPE_CACHE (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT="${VARIANT:-cpu}"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
PLUGIN_BUILD="${PLUGIN_BUILD:-build/plugins}"
BAKE_DEMO="${BAKE_DEMO:-1}"

step() { echo "==> install.sh: $*"; }
fail() { echo "install.sh: error: $*" >&2; exit 2; }

case "$VARIANT" in cpu|gpu) ;; *) fail "VARIANT must be cpu or gpu, got '$VARIANT'";; esac
if [ -n "${VENV:-}" ]; then
  [ -x "$VENV/bin/python" ] || { step "virtual env $VENV"; "$PYTHON" -m venv "$VENV"; }
  PYTHON="$VENV/bin/python"
fi
PIP=("$PYTHON" -m pip install --no-input)
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail "Python >= 3.10 needed"

step "torch ($TORCH${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL})"
"${PIP[@]}" "$TORCH" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

# onnxruntime and onnxruntime-gpu must not be installed together: the gpu variant takes the
# gpu extra (onnxruntime-gpu, tensorrt, cuda-python) plus onnx instead of the export extra.
if [ "$VARIANT" = gpu ]; then extras="serve,gpu"; extra_reqs=("onnx>=1.16"); else
  extras="serve,export"; extra_reqs=(); fi
target="."
[ "${EDITABLE:-0}" = 1 ] && target="-e ."
step "project [$extras] ${extra_reqs[*]:-}"
# shellcheck disable=SC2086  # $target is "." or "-e ."
"${PIP[@]}" $target"[$extras]" "${extra_reqs[@]}"

if [ "$VARIANT" = gpu ]; then
  step "TensorRT plugin library -> $PLUGIN_BUILD"
  plugins/build.sh "$PLUGIN_BUILD" -DIRPE_REQUIRE_TENSORRT=ON
fi

step "check"
"$PYTHON" -m irpe --version
"$PYTHON" -c 'import serve.app, serve.backends.ort_backend, onnxruntime as ort; print("serve ok; onnxruntime providers:", ", ".join(ort.get_available_providers()))'

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
