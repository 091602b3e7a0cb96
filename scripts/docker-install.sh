#!/bin/sh
# The image's install steps (the Dockerfile's build stage runs this twice: DEPS_ONLY=1, then the
# rest): scripts/install.sh into /opt/venv, only from /wheelhouse when the build context had
# wheels there (offline), else from the network, where the CPU variant's torch comes from the
# PyTorch CPU index unless TORCH_INDEX_URL says otherwise. With ORT headers under ORT_ROOT,
# cmake and g++ come from apt first (the build stage only; the image never gets them).
# Environment: the build args VARIANT, TORCH, TORCH_INDEX_URL, ORT_ROOT; DEPS_ONLY.
set -e
cd "$(dirname "$0")/.."
WHEELHOUSE=
ls /wheelhouse/*.whl >/dev/null 2>&1 && WHEELHOUSE=/wheelhouse
if [ "$VARIANT" = cpu ] && [ -z "$TORCH_INDEX_URL" ] && [ -z "$WHEELHOUSE" ]; then
  TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
fi
if [ "${DEPS_ONLY:-0}" != 1 ] &&
    [ -n "$(find "$ORT_ROOT" -maxdepth 4 -name onnxruntime_cxx_api.h 2>/dev/null)" ]; then
  tools=
  command -v cmake >/dev/null || tools=cmake
  command -v c++ >/dev/null || tools="$tools g++"
  if [ -n "$tools" ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $tools
  fi
fi
export WHEELHOUSE TORCH_INDEX_URL PYTHON=python3 VENV=/opt/venv
scripts/install.sh
if [ "${DEPS_ONLY:-0}" != 1 ]; then
  mkdir -p /opt/irpe-deploy/plugins
  cp build/plugins/*.so /opt/irpe-deploy/plugins/ 2>/dev/null || true
fi
