# irpe-deploy serving image: GPU on an NGC TensorRT base (default) or CPU (--build-arg VARIANT=cpu).
#
#   docker build -t irpe-deploy .                                  # GPU: TensorRT + plugin library
#   docker build -t irpe-deploy:cpu --build-arg VARIANT=cpu .      # CPU: python:3.11-slim
#   docker build -t irpe-deploy:cpu --build-arg VARIANT=cpu \
#       --build-context ort-headers=/opt/onnxruntime-linux-x64-1.23.2 .   # + iRPE ORT custom ops
#   docker run --gpus all -p 8000:8000 irpe-deploy                 # demo models, onnxruntime
#   docker run -p 8000:8000 -v $PWD/models:/models \
#       -e IRPE_SERVE_REPOSITORY=/models/models.yaml irpe-deploy:cpu   # your model repository
#
# The install steps live in scripts/install.sh (CI runs the same script). Docker does not run on
# the development machines, so this file is checked by review and CI, not built there.
#
# The iRPE ONNX Runtime custom-op library (faster than the files' ONNX functions) needs the ORT
# C/C++ headers, which no pip package ships: give an ONNX Runtime release (or any folder with
# include/onnxruntime_cxx_api.h) as the build context `ort-headers` (BuildKit), or a folder
# already in the base image with --build-arg ORT_ROOT=/usr. Without them the build prints one
# "ort-ops: skipped" line and the server runs the ONNX functions. $IRPE_ORT_OPS_LIBRARY names
# the library for the server (the project is installed into site-packages, not this folder).
ARG VARIANT=gpu
ARG GPU_BASE=nvcr.io/nvidia/tensorrt:25.10-py3
ARG CPU_BASE=python:3.11-slim

# empty unless --build-context ort-headers=DIR replaces it
FROM scratch AS ort-headers
FROM ${GPU_BASE} AS base-gpu
ENV IRPE_ORT_OPS_LIBRARY=/opt/irpe-deploy/build/plugins/libirpe_ort_ops_cuda.so
FROM ${CPU_BASE} AS base-cpu
ENV IRPE_ORT_OPS_LIBRARY=/opt/irpe-deploy/build/plugins/libirpe_ort_ops.so

FROM base-${VARIANT}
ARG VARIANT
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=
ARG ORT_ROOT=/opt/ort-headers
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    IRPE_CACHE=/var/cache/irpe \
    IRPE_SERVE_HOST=0.0.0.0 IRPE_SERVE_PORT=8000 \
    IRPE_PLUGIN_DIR=/opt/irpe-deploy/build/plugins
WORKDIR /opt/irpe-deploy
COPY pyproject.toml README.md ./
COPY irpe ./irpe
COPY export ./export
COPY serve ./serve
COPY plugins ./plugins
COPY benchmarks ./benchmarks
COPY scripts ./scripts
# torch (CPU wheels from the PyTorch index in the CPU image unless TORCH_INDEX_URL says
# otherwise), the project, the plugin library (GPU), the ORT custom-op library (when headers
# are given; cmake + g++ only for that step), and the demo ONNX baked into $IRPE_CACHE
RUN --mount=type=bind,from=ort-headers,target=/opt/ort-headers \
    set -e; tools=; \
    if [ -n "$(find "$ORT_ROOT" -maxdepth 4 -name onnxruntime_cxx_api.h 2>/dev/null)" ]; then \
        command -v cmake >/dev/null || tools=cmake; \
        command -v c++ >/dev/null || tools="$tools g++"; fi; \
    if [ -n "$tools" ]; then apt-get update -qq; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $tools; fi; \
    if [ "$VARIANT" = cpu ] && [ -z "$TORCH_INDEX_URL" ]; then \
        TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu; fi; \
    VARIANT="$VARIANT" TORCH="$TORCH" TORCH_INDEX_URL="$TORCH_INDEX_URL" PYTHON=python3 \
    ORT_ROOT="$ORT_ROOT" scripts/install.sh; \
    if [ -n "$tools" ]; then apt-get purge -y -qq --auto-remove $tools; \
        rm -rf /var/lib/apt/lists/*; fi
RUN useradd --create-home --uid 10001 irpe \
    && mkdir -p "$IRPE_CACHE" /models && chown -R irpe "$IRPE_CACHE" /models
USER irpe
EXPOSE 8000
# ready = every model loaded and warmed up (first start may export ONNX / build engines)
HEALTHCHECK --interval=15s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('IRPE_SERVE_PORT', '8000'), timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
CMD ["irpe", "serve"]
