# GPU image on an NGC TensorRT base (TensorRT + CUDA + Python), or a CPU image:
#   docker build -t irpe-deploy .                                   # GPU (NGC TensorRT base)
#   docker build -t irpe-deploy:cpu --build-arg VARIANT=cpu \
#       --build-arg BASE=python:3.11-slim .                         # CPU only
# Not built on the development machines (no Docker engine there); see docs/DECISIONS.md.
ARG BASE=nvcr.io/nvidia/tensorrt:25.10-py3
FROM ${BASE}
ARG VARIANT=gpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/irpe-deploy
COPY pyproject.toml README.md ./
COPY irpe ./irpe
COPY benchmarks ./benchmarks
RUN if [ "$VARIANT" = "cpu" ]; then \
        pip install torch --index-url https://download.pytorch.org/whl/cpu; \
    else \
        pip install torch; \
    fi && pip install ".[serve,export]"
RUN useradd --create-home irpe
USER irpe
# The main job: until the server lands this is the self-check (see README).
CMD ["irpe", "check"]
