# irpe-deploy serving image: GPU on an NGC TensorRT base (default) or CPU (--build-arg VARIANT=cpu).
# Needs BuildKit (DOCKER_BUILDKIT=1 with docker 20.10+, the default with buildx).
#
#   docker build -t irpe-deploy .                                  # GPU: TensorRT + plugin library
#   docker build -t irpe-deploy:cpu --build-arg VARIANT=cpu .      # CPU: python:3.11-slim
#   scripts/docker-wheelhouse.sh && docker build ...               # offline: pip --no-index from wheelhouse/
#   docker run -p 8000:8000 irpe-deploy:cpu                        # demo models on OpenVINO (CPU default)
#   docker run -p 8000:8000 -v $PWD/models:/models \
#       -e IRPE_SERVE_REPOSITORY=/models/models.yaml irpe-deploy:cpu   # your model repository
#
# Two stages on one base: `build` makes the virtual environment /opt/venv with
# scripts/install.sh (the project, not editable; the ORT custom-op / TensorRT plugin libraries;
# the demo ONNX files baked into $IRPE_CACHE); `runtime` (the image) copies only the venv, the
# libraries and the cache, so sources, compilers and pip's build files stay in `build`. The venv
# keeps its path (/opt/venv) in both stages, because its scripts name their interpreter by path.
# `make docker-test` builds the CPU image offline and probes it (docs/docker.md).
#
# Offline build: wheelhouse/ in the build context (scripts/docker-wheelhouse.sh) is mounted into
# the build stage and pip installs from it with --no-index; without it pip uses the network
# (CPU torch from the PyTorch CPU index unless TORCH_INDEX_URL says otherwise).
#
# The iRPE ONNX Runtime custom-op library (faster than the files' ONNX functions) needs the ORT
# C/C++ headers, which no pip package ships: give an ONNX Runtime release (or any folder with
# include/onnxruntime_cxx_api.h) as the build context `ort-headers` (buildx:
# --build-context ort-headers=DIR), or a folder already in the base image with
# --build-arg ORT_ROOT=/usr; cmake and g++ then come from apt in the build stage only. Without
# them the build prints one "ort-ops: skipped" line and the server runs the ONNX functions.
# The iRPE OpenVINO library (CPU; headers from the openvino wheel) is built with the same cmake
# and g++: without them "ov-ops: skipped", and OpenVINO runs the frontend conversions.
ARG VARIANT=gpu
ARG GPU_BASE=nvcr.io/nvidia/tensorrt:25.10-py3
ARG CPU_BASE=python:3.11-slim

# empty unless --build-context ort-headers=DIR replaces it
FROM scratch AS ort-headers
# the context's wheelhouse/ (its wheels at /), empty when there is none
FROM scratch AS wheelhouse
COPY wheelhouse* /

FROM ${GPU_BASE} AS base-gpu
ENV IRPE_ORT_OPS_LIBRARY=/opt/irpe-deploy/plugins/libirpe_ort_ops_cuda.so
FROM ${CPU_BASE} AS base-cpu
ENV IRPE_ORT_OPS_LIBRARY=/opt/irpe-deploy/plugins/libirpe_ort_ops.so \
    IRPE_OV_OPS_LIBRARY=/opt/irpe-deploy/plugins/libirpe_openvino.so

FROM base-${VARIANT} AS base
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 \
    IRPE_CACHE=/var/cache/irpe IRPE_PLUGIN_DIR=/opt/irpe-deploy/plugins \
    IRPE_CPU_ATTENTION_LIBRARY=/opt/irpe-deploy/plugins/libirpe_cpu_attention.so \
    IRPE_SERVE_HOST=0.0.0.0 IRPE_SERVE_PORT=8000

FROM base AS build
ARG VARIANT
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=
ARG ORT_ROOT=/opt/ort-headers
WORKDIR /src
# torch and the dependencies first: a layer that only pyproject.toml (or the wheelhouse) changes
COPY pyproject.toml ./
COPY scripts/install.sh scripts/requirements.py scripts/docker-install.sh ./scripts/
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse DEPS_ONLY=1 scripts/docker-install.sh
COPY README.md ./
COPY irpe ./irpe
COPY export ./export
COPY serve ./serve
COPY plugins ./plugins
# the project, the ORT custom-op / TensorRT plugin libraries, the demo bake
RUN --mount=type=bind,from=ort-headers,target=/opt/ort-headers \
    --mount=type=bind,from=wheelhouse,target=/wheelhouse scripts/docker-install.sh
# lean (after the demo was exported with the full install): what a server never reads, i.e.
# torch's C++ headers (extension builds) and test binaries, the packages' test suites
ARG SLIM=1
RUN if [ "$SLIM" = 1 ]; then cd /opt/venv/lib/python3*/site-packages && \
        rm -rf torch/include torch/bin/test_* && \
        find . -depth -type d -name tests -prune -exec rm -rf {} + ; fi

FROM base AS runtime
RUN useradd --create-home --uid 10001 irpe && mkdir -p /models && chown irpe /models
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/irpe-deploy/plugins /opt/irpe-deploy/plugins
COPY --from=build --chown=10001 /var/cache/irpe /var/cache/irpe
# drain on SIGTERM within docker stop's default 10 s: readiness 503 for 2 s while requests are
# still served, then at most 6 s for those in flight (Kubernetes sets its own: deploy/)
ENV IRPE_SERVE_DRAIN_GRACE_S=2 IRPE_SERVE_SHUTDOWN_TIMEOUT_S=6
USER 10001
WORKDIR /home/irpe
EXPOSE 8000
VOLUME ["/var/cache/irpe"]
# ready = every model loaded and warmed up (first start may export ONNX / build engines)
HEALTHCHECK --interval=10s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('IRPE_SERVE_PORT', '8000'), timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
CMD ["irpe", "serve"]
