# Two commands are the contract (README): `make demo` runs the main job, `make test` the tests.
# Both create .venv on first use. torch==2.13.0 goes in FIRST, so the extras never pull another torch: where a
# CPU build of it lies on local disk (2.13.0+cpu, our build machines) pip takes that; from PyPI, the Linux x86_64
# torch==2.13.0 is a CUDA build (with its nvidia-* runtime wheels); TORCH_INDEX names PyTorch's index for one
# CUDA version (e.g. https://download.pytorch.org/whl/cu128) or its CPU build (.../whl/cpu). docs/gpu.md.
# The install stamp is keyed on pyproject.toml AND the extras (and TORCH_INDEX), so `make demo EXTRAS=gpu,dev` after
# `make demo` installs again. ONNX Runtime comes in exactly one flavour: onnxruntime (extra cpu) and
# onnxruntime-gpu (extra gpu) install the same module, so the other one is removed before the install.
# The toolkit extra (train, export, bench) always goes in: EXTRAS adds to it (docs/dependencies.md: the profiles).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= cpu,openvino,dev,ray,grpc,otel
TORCH_INDEX ?=
comma := ,
EXTRA_LIST := $(subst $(comma), ,$(EXTRAS))
STAMP := $(VENV)/.installed-$(shell (cat pyproject.toml; echo 'extras=$(EXTRAS) torch_index=$(TORCH_INDEX)') | cksum | cut -d' ' -f1)
# the flavour these extras do not install, removed first (none when they name neither)
ORT_OTHER := $(if $(filter gpu,$(EXTRA_LIST)),onnxruntime,$(if $(filter cpu,$(EXTRA_LIST)),onnxruntime-gpu,))
PIP := $(BIN)/pip --disable-pip-version-check

.PHONY: install demo test reports image clean-venv

$(STAMP): pyproject.toml
	@if [ -n "$(filter cpu,$(EXTRA_LIST))" ] && [ -n "$(filter gpu,$(EXTRA_LIST))" ]; then \
	  echo "EXTRAS=$(EXTRAS) names both cpu and gpu: onnxruntime and onnxruntime-gpu install the same module;" \
	       "choose one (EXTRAS=cpu,... or EXTRAS=gpu,...)" >&2; exit 2; fi
	rm -f $(VENV)/.installed-*
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(if $(ORT_OTHER),$(PIP) uninstall --quiet -y $(ORT_OTHER))
	$(PIP) install --quiet -e '.[toolkit,$(EXTRAS)]'
	@# exactly one flavour: a dependency that pulled the other back in would leave a broken module
	@if $(PIP) show onnxruntime >/dev/null 2>&1 && $(PIP) show onnxruntime-gpu >/dev/null 2>&1; then \
	  echo "both onnxruntime and onnxruntime-gpu are installed in $(VENV); run make clean-venv and install again" >&2; \
	  exit 1; fi
	@if [ -n "$(filter gpu,$(EXTRA_LIST))" ] && ! $(BIN)/python -c "import torch; assert torch.version.cuda" 2>/dev/null; \
	then echo "note: torch in $(VENV) is a CPU build; for CUDA: make clean-venv, then make demo EXTRAS=gpu,dev" \
	     "TORCH_INDEX=https://download.pytorch.org/whl/cu128 (the CUDA version your driver runs; docs/gpu.md)"; fi
	@# optimum-intel 2.2.0 requires torchvision (for its image models). PyPI's torchvision is built against the
	@# CUDA torch: beside the CPU torch above it fails to import, and transformers 5, which imports an installed
	@# torchvision with its models, then fails too. qserve needs none: remove one that does not import.
	$(BIN)/python -c "import torchvision" >/dev/null 2>&1 || $(BIN)/pip uninstall --quiet -y torchvision
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/qserve pipeline

# The browser tests (tests/e2e/test_browser.py) drive the system's chromium through chromedriver. As root (CI)
# install them when missing; elsewhere, or if apt fails, those tests skip and say why (under CI=true they fail).
# The image test (tests/integration/test_image.py) needs a docker daemon: as root, docker.io and debootstrap are
# installed and dockerd started when missing.
test: $(STAMP)
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 \
	    || ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver wrk) \
	      >/dev/null 2>&1 || echo "note: could not install chromium, chromium-driver, wrk; the browser and wrk tests will skip"; \
	  fi; \
	fi
	@if [ "$$(id -u)" = 0 ] && ! docker info >/dev/null 2>&1; then \
	  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap) \
	      >/dev/null 2>&1 || echo "note: could not install docker.io, debootstrap; the image test will skip"; \
	  fi; \
	  if command -v dockerd >/dev/null 2>&1; then \
	    (nohup dockerd >/tmp/qserve-dockerd.log 2>&1 &); \
	    for i in $$(seq 30); do docker info >/dev/null 2>&1 && break; sleep 1; done; \
	  fi; \
	fi
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

# Re-run the committed reports one stage at a time on the CPU that measured them, then re-render the
# README's and docs' tables from their JSON (benchmarks/render/rebuild.py; docs/bench.md lists stages).
# No STAGE: list the stages. FORCE=1 on another CPU: re-render md from JSON, measure nothing.
reports: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.render.rebuild $(STAGE) $(if $(filter 1 yes true,$(FORCE)),--force)

# The container images (docker/Dockerfile, docs/deploy.md): IMAGE:serve (ONNX Runtime + OpenVINO, no torch) and
# IMAGE:toolkit. BASE: the base image (default python:3.11-slim-bookworm, or one docker/base.sh makes with
# debootstrap where docker cannot pull); TORCH_INDEX as above (default for the image: PyTorch's CPU builds).
IMAGE ?= qserve
IMAGE_TARGETS ?= serve toolkit
image:
	IMAGE=$(IMAGE) BASE=$(BASE) $(if $(TORCH_INDEX),TORCH_INDEX=$(TORCH_INDEX)) docker/build.sh $(IMAGE_TARGETS)

clean-venv:
	rm -rf $(VENV)
