# One venv per checkout; every target works on a fresh machine (torch: the CPU wheel on disk).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# TORCH goes to pip unquoted, so it may carry pip options; where the configured index serves
# the CUDA build: TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (a spec with < or > needs inner quotes: TORCH="'torch>=2.4'")
TORCH  ?= torch==2.13.0
EXTRAS ?= dev
RUN_EXTRAS ?= serve,export,openvino

.PHONY: install test lint run check bench clean demo-models ort-ops ov-ops gpu-check gpu-carry docker-test perf-analyzer

# one marker per extras set: `make run` installs serve,export,openvino; `make test` later adds dev
$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[$*]"
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

## make test: install into .venv, then run the test suite (what CI runs)
test: install
	$(PY) -m pytest -q --durations=25

## make lint: the lint and type gate, zero findings (ruff, then mypy; both configured in
## pyproject.toml; CI runs it after make test)
lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

## make run: the main job: serve the bundled demo classifier + detector on 127.0.0.1:8000,
## offline, on OpenVINO (the CPU default, which RUN_EXTRAS installs; ONNX Runtime where
## OpenVINO is not installed); Ctrl-C drains and stops. HOST/PORT override the address.
## Builds the iRPE ONNX Runtime ops and the iRPE OpenVINO library first where it can (make
## ort-ops, make ov-ops), never failing the run.
HOST ?= 127.0.0.1
PORT ?= 8000
run: $(VENV)/.installed-$(RUN_EXTRAS)
	@$(MAKE) -s --no-print-directory ort-ops || \
	  echo "make run: the ORT custom-op library did not build (above); on ONNX Runtime the files' functions run instead"
	@$(MAKE) -s --no-print-directory ov-ops || \
	  echo "make run: the OpenVINO library did not build (above); OpenVINO converts the iRPE ops to its own instead"
	$(VENV)/bin/irpe serve --host $(HOST) --port $(PORT)

## make ort-ops: the ONNX Runtime custom-op library $(ORT_OPS_DIR)/libirpe_ort_ops.so, which the
## server then uses, and libirpe_cpu_attention.so (torch's iRPE attention on CPU), where ORT headers (ORT_ROOT / ONNXRUNTIME_ROOT, else $(SHARED_DIR)/third_party/
## onnxruntime-1.23), cmake and a C++ compiler are found; else one line says why (exit 0).
## Rebuilt only when its sources change; ORT_OPS_CMAKE is CMake's tree.
SHARED_DIR    ?= $(abspath $(CURDIR)/../shared)
ORT_OPS_DIR   ?= build/plugins
ORT_OPS_CMAKE ?= $(ORT_OPS_DIR)/ort
ORT_OPS_SOURCES := $(wildcard plugins/onnxruntime/*.cpp plugins/onnxruntime/*.h \
  plugins/cpu/*.cpp plugins/cpu/*.h) plugins/onnxruntime/CMakeLists.txt \
  plugins/cpu/CMakeLists.txt plugins/kernels/irpe_bucket.h plugins/kernels/irpe_methods.h
ort-ops: $(ORT_OPS_DIR)/libirpe_ort_ops.so
$(ORT_OPS_DIR)/libirpe_ort_ops.so: $(ORT_OPS_SOURCES)
	@IRPE_SHARED="$(SHARED_DIR)" IRPE_ORT_OUTPUT_DIR="$(abspath $(ORT_OPS_DIR))" \
	  plugins/onnxruntime/build.sh --optional "$(ORT_OPS_CMAKE)"

## make ov-ops: the iRPE OpenVINO extension library $(ORT_OPS_DIR)/libirpe_openvino.so (the
## iRPE ops and a whole iRPE attention block for OpenVINO; irpe/runtime/openvino/library.py),
## from the installed openvino wheel's headers, where cmake and a C++ compiler are found; else
## one line says why (exit 0). Rebuilt only when its sources change.
OV_OPS_SOURCES := $(wildcard plugins/openvino/*.cpp plugins/openvino/*.hpp \
  plugins/cpu/*.cpp plugins/cpu/*.h) plugins/openvino/CMakeLists.txt \
  plugins/cpu/CMakeLists.txt plugins/kernels/irpe_bucket.h
ov-ops: $(ORT_OPS_DIR)/libirpe_openvino.so
$(ORT_OPS_DIR)/libirpe_openvino.so: $(OV_OPS_SOURCES)
	@PYTHON="$(PY)" IRPE_OV_OUTPUT_DIR="$(abspath $(ORT_OPS_DIR))" \
	  plugins/openvino/build.sh --optional "$(ORT_OPS_DIR)/ov"

## make docker-test: build the CPU serving image offline and probe it like a user (starts a
## Docker engine with its data-root in build/docker when none answers, and stops it after;
## a Debian base from debootstrap when python:3.11-slim is absent). Skips, saying why, when
## no engine can start (fails instead with CI=true). docs/docker.md
docker-test: install
	PROBE_PYTHON=$(PY) scripts/docker-test.sh

## make check: the lint and type gate (make lint), then the self-test (bucket ids, ops,
## forward, checkpoint round trip)
check: lint $(VENV)/.installed-$(RUN_EXTRAS)
	$(VENV)/bin/irpe check

## make bench: forward time of DeiT-S plain / iRPE-K / iRPE-QKV on CPU (bs 8, 2 threads), with
## the native iRPE attention kernel where make ort-ops builds it (its report says which)
bench: install
	@$(MAKE) -s --no-print-directory ort-ops || \
	  echo "make bench: the native kernel did not build (above); timing the SDPA path"
	$(PY) -m benchmarks.deit_forward

## make gpu-check: a GPU machine's verdict on this checkout in ONE device call of <= 8 minutes
## (scripts/gpu_check.py, docs/gpu-check.md): env -> correctness (CUDA ops, fused attention, the
## TensorRT plugin harness, graph/nvJPEG probes, one launch per kernel variant) -> key benchmark
## rows -> the rest of tests/gpu, each step under its timeout -> one report in
## benchmarks/results/<device>/ (or GPU_CHECK_OUT=DIR), written after every step. Run it again
## and it resumes: only the steps not yet finished (FRESH=1 starts over). PHASES=env,correct,
## bench,rest and STEPS='correct/*' narrow it. Needs only the checkout and python3 with torch
## (no install, never downloads). `make gpu-check --dry-run` (or -n): the plan, its budget
## arithmetic and the carry's size checked (CI), and the steps that need no GPU run.
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	+PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_CHECK_PY) scripts/gpu_check.py \
	  $(if $(findstring n,$(firstword -$(MAKEFLAGS))),--dry-run) $(if $(FRESH),--fresh) \
	  $(if $(PHASES),--phases $(PHASES)) $(if $(STEPS),--steps '$(STEPS)') \
	  $(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT)) $(GPU_CHECK_ARGS)

## make gpu-carry: prepare what must travel to a lent GPU machine, in ignored folders, and print
## their sizes (<= 60 MiB; the device tool's carry: .whl .third_party .gpu-prebuilt): the serving
## stack's Python 3.12 wheels (+ cmake; GPU_CARRY_ARGS=--no-cmake leaves it out) in .whl/, the
## TensorRT/ORT headers of $(SHARED_DIR)/third_party in .third_party/, and the plugin harness
## built for sm_90 in .gpu-prebuilt/. Downloads the wheels (pip download) unless present.
gpu-carry:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_CHECK_PY) scripts/gpu_carry.py \
	  --shared "$(SHARED_DIR)" $(GPU_CARRY_ARGS)

## make perf-analyzer: Triton's perf_analyzer (PyPI wheel, glibc >= 2.38) made runnable on an
## older glibc: a Debian 13 minimal root (debootstrap, root) in ~/.cache/irpe/perf-analyzer/ whose
## loader and libraries run the binary (tools/perf_analyzer.py; downloads; CI runs it before
## make test, so tests/test_perf_analyzer.py never skips there). Kept once made.
perf-analyzer: install
	$(PY) -m tools.perf_analyzer prepare

## make demo-models: regenerate the bundled demo weights (synthetic data -> irpe train -> irpe/demo)
# ~1 h on 2 CPU cores (one thread per run, both runs in sequence); see docs/DECISIONS.md ("Training, data and demo models")
DEMO ?= build/demo
IRPE := $(VENV)/bin/irpe
demo-models: install
	rm -rf $(DEMO)/cls $(DEMO)/det
	$(IRPE) data shapes-cls --out $(DEMO)/shapes-cls --train 16000 --val 1000 --seed 0 --force
	$(IRPE) data shapes-det --out $(DEMO)/shapes-det --train 8000 --val 500 --seed 0 --force
	$(IRPE) train cls --model deit_shapes_irpe --data $(DEMO)/shapes-cls --output $(DEMO)/cls \
	  --epochs 15 --batch-size 32 --lr 3e-4 --warmup-epochs 0.5 --drop-path 0.0 --threads 1
	$(IRPE) train det --model detr_shapes_irpe --data $(DEMO)/shapes-det --output $(DEMO)/det \
	  --epochs 12 --batch-size 16 --lr 2e-4 --lr-backbone 2e-4 --warmup-epochs 0.3 --threads 1
	cp $(DEMO)/cls/model.safetensors irpe/demo/deit_shapes_irpe.safetensors
	cp $(DEMO)/det/model.safetensors irpe/demo/detr_shapes_irpe.safetensors
	$(IRPE) eval deit_shapes_irpe --data $(DEMO)/shapes-cls
	$(IRPE) eval detr_shapes_irpe --data $(DEMO)/shapes-det

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
