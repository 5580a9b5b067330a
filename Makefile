# Two commands are the contract (README): `make demo` runs the main job, `make test` the tests.
# Both create .venv on first use. torch==2.13.0 goes in FIRST: a CPU build of it lies on
# local disk, while any other torch request would pull a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
EXTRAS ?= cpu,openvino,dev,ray,grpc,otel

.PHONY: install demo test reports clean-venv

$(STAMP): pyproject.toml
	rm -f $(VENV)/.installed-*
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
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
test: $(STAMP)
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 \
	    || ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver wrk) \
	      >/dev/null 2>&1 || echo "note: could not install chromium, chromium-driver, wrk; the browser and wrk tests will skip"; \
	  fi; \
	fi
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

# Re-run the committed reports one stage at a time on the CPU that measured them, then re-render the
# README's and docs' tables from their JSON (benchmarks/rebuild_reports.py; docs/bench.md lists stages).
# No STAGE: list the stages. FORCE=1 on another CPU: re-render md from JSON, measure nothing.
reports: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.rebuild_reports $(STAGE) $(if $(filter 1 yes true,$(FORCE)),--force)

clean-venv:
	rm -rf $(VENV)
