#!/usr/bin/env bash
# make docker-test: build the CPU serving image offline and probe it as a user would.
#
#   1. a Docker engine: the one that answers, else dockerd started with its data-root in
#      build/docker (stopped at the end; images and build cache stay there for the next run)
#   2. the base: python:3.11-slim when the engine has it, else a Debian base made with
#      debootstrap (scripts/docker-base.sh, reused while its package list is unchanged)
#   3. the wheelhouse (scripts/docker-wheelhouse.sh, reused while pyproject.toml is unchanged)
#   4. docker build of the CPU image, offline (--network none; pip --no-index from the
#      wheelhouse): time, size and what takes the space
#   5. the GPU install path on the same base: stops at once, saying that CUDA/TensorRT are needed
#   6. tests/docker_probe.py: healthy, every endpoint equal to `irpe serve` outside the
#      container, uid 10001, read-only root, mounted repository, 4xx JSON, docker stop drains
#
# Without an engine (none answers and dockerd cannot start) it prints why and exits 0, except
# with CI=true, where that is a failure. PROBE_PYTHON: the interpreter of the probe, of the
# reference `irpe serve` and of pip download (default .venv/bin/python, the dev install of
# `make install`). IMAGE: the tag built (default irpe-deploy:cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PROBE_PYTHON="${PROBE_PYTHON:-.venv/bin/python}"
IMAGE="${IMAGE:-irpe-deploy:cpu}"
say() { echo "==> docker-test: $*"; }
t0=$SECONDS

# shellcheck source=scripts/docker-engine.sh
source scripts/docker-engine.sh
if ! engine_up; then
  if [ "${CI:-}" = true ]; then echo "docker-test: error: $ENGINE_WHY" >&2; exit 1; fi
  echo "docker-test: skipped: $ENGINE_WHY"
  exit 0
fi
trap engine_down EXIT
trap "exit 130" INT TERM
export DOCKER DOCKER_BUILDKIT=1

if "$DOCKER" image inspect python:3.11-slim >/dev/null 2>&1; then base=python:3.11-slim
else base="$(scripts/docker-base.sh)"; fi
say "base $base ($((SECONDS - t0)) s so far)"
PYTHON="$PROBE_PYTHON" scripts/docker-wheelhouse.sh
say "wheelhouse ready ($((SECONDS - t0)) s so far)"

log=build/docker-test-build.log
mkdir -p build
# --network none: the build's RUN steps have no network at all, so offline is proven, not assumed
say "docker build --network none --build-arg VARIANT=cpu --build-arg CPU_BASE=$base -t $IMAGE .  (log: $log)"
b0=$SECONDS
"$DOCKER" build --progress=plain --network none --build-arg VARIANT=cpu --build-arg CPU_BASE="$base" \
  -t "$IMAGE" . >"$log" 2>&1 || { tail -n 40 "$log"; echo "docker-test: error: the build failed" >&2; exit 1; }
build_s=$((SECONDS - b0))
# the engine this script started keeps only tagged images and the newest 4 GB of build cache
if [ -n "$ENGINE_PID" ]; then
  "$DOCKER" image prune -f >/dev/null
  "$DOCKER" builder prune -f --keep-storage 4gb >/dev/null
fi
size="$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE")"
base_size="$("$DOCKER" image inspect --format '{{.Size}}' "$base")"
say "built $IMAGE in $build_s s: $((size / 1000000)) MB ($((base_size / 1000000)) MB of it the base $base)"
echo "largest parts of the image (MB):"
"$DOCKER" run --rm --entrypoint sh "$IMAGE" -c \
  'cd /opt/venv/lib/python3*/site-packages && du -sm torch openvino onnxruntime numpy* sympy* onnx pillow* PIL 2>/dev/null | sort -rn | head -n 6;
   du -sm torch/lib/libtorch_cpu.so; find . -name __pycache__ -prune -exec du -sk {} + | awk "{ s += \$1 } END { printf \"%d\t.pyc files\n\", s / 1024 }";
   du -sm /opt/venv /var/cache/irpe /usr 2>/dev/null' |
  sed 's/^/  /'

say "the GPU install path on $base (no CUDA, no TensorRT there)"
gpu_log=build/docker-test-gpu.log
if "$DOCKER" build --progress=plain --network none --target build --build-arg VARIANT=gpu --build-arg GPU_BASE="$base" \
    -t irpe-deploy:gpu-check . >"$gpu_log" 2>&1; then
  echo "docker-test: error: the GPU build passed on a base without CUDA/TensorRT" >&2; exit 1
fi
grep -o "install.sh: error: VARIANT=gpu needs CUDA and TensorRT.*" "$gpu_log" | head -n 1 | sed 's/^/  /' | grep . ||
  { tail -n 20 "$gpu_log"; echo "docker-test: error: the GPU build failed without the CUDA/TensorRT message" >&2; exit 1; }

say "probing $IMAGE (tests/docker_probe.py)"
"$PROBE_PYTHON" -m tests.docker_probe --image "$IMAGE" --docker "$DOCKER"
say "passed in $((SECONDS - t0)) s (build $build_s s, image $((size / 1000000)) MB)"
