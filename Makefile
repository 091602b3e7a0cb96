# One venv per checkout; every target works on a fresh machine (torch: the CPU wheel on disk).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
EXTRAS ?= dev

.PHONY: install test run check bench clean demo-models

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

## make test: install into .venv, then run the test suite (what CI runs)
test: install
	$(PY) -m pytest -q

## make run: the main job: serve the bundled demo classifier + detector on 127.0.0.1:8000
## (ONNX Runtime, offline; Ctrl-C drains and stops). HOST/PORT override the address.
HOST ?= 127.0.0.1
PORT ?= 8000
run: install
	$(VENV)/bin/irpe serve --host $(HOST) --port $(PORT)

## make check: the self-test (bucket ids, ops, forward, checkpoint round trip)
check: install
	$(VENV)/bin/irpe check

## make bench: forward time of DeiT-S plain / iRPE-K / iRPE-QKV on CPU (bs 8, 2 threads)
bench: install
	$(PY) -m benchmarks.deit_forward

## make demo-models: regenerate the bundled demo weights (synthetic data -> irpe train -> irpe/demo)
# ~1 h on 2 CPU cores (one thread per run, both runs in sequence); see docs/demo-models.md
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
	rm -rf $(VENV) build *.egg-info .pytest_cache
