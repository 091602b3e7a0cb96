# irpe-deploy serving image: GPU on an NGC TensorRT base (default) or CPU (--build-arg VARIANT=cpu).
#
#   docker build -t irpe-deploy .                                  # GPU: TensorRT + plugin library
#   docker build -t irpe-deploy:cpu --build-arg VARIANT=cpu .      # CPU: python:3.11-slim
#   docker run --gpus all -p 8000:8000 irpe-deploy                 # demo models, onnxruntime
#   docker run -p 8000:8000 -v $PWD/models:/models \
#       -e IRPE_SERVE_REPOSITORY=/models/models.yaml irpe-deploy:cpu   # your model repository
#
# The install steps live in scripts/install.sh (CI runs the same script). Docker does not run on
# the development machines, so this file is checked by review and CI, not built there.
ARG VARIANT=gpu
ARG GPU_BASE=nvcr.io/nvidia/tensorrt:25.10-py3
ARG CPU_BASE=python:3.11-slim

FROM ${GPU_BASE} AS base-gpu
FROM ${CPU_BASE} AS base-cpu

FROM base-${VARIANT}
ARG VARIANT
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=
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
# otherwise), the project, the plugin library (GPU), and the demo ONNX baked into $IRPE_CACHE
RUN if [ "$VARIANT" = cpu ] && [ -z "$TORCH_INDEX_URL" ]; then \
        TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu; fi; \
    VARIANT="$VARIANT" TORCH="$TORCH" TORCH_INDEX_URL="$TORCH_INDEX_URL" PYTHON=python3 \
    scripts/install.sh
RUN useradd --create-home --uid 10001 irpe \
    && mkdir -p "$IRPE_CACHE" /models && chown -R irpe "$IRPE_CACHE" /models
USER irpe
EXPOSE 8000
# ready = every model loaded and warmed up (first start may export ONNX / build engines)
HEALTHCHECK --interval=15s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('IRPE_SERVE_PORT', '8000'), timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
CMD ["irpe", "serve"]
