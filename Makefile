PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned so that a CPU build is installed; set TORCH_SPEC to choose another (e.g. a CUDA build).
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test bench clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[mpich,test]"
	touch $@

# The main job on a bundled example: evolve image classifiers for the shapes dataset (about 3.5 minutes on 2 cores).
DEMO_DIR ?= runs/demo
demo: $(VENV)/.installed
	mkdir -p runs
	$(PY) -m examples.shapes --out runs/shapes.h5
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/galapagos evolve --data runs/shapes.h5 --out $(DEMO_DIR) --config examples/demo.toml \
		--budget-minutes 3
	$(VENV)/bin/galapagos predict --model $(DEMO_DIR)/best --data runs/shapes.h5 --split test

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
