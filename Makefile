# Two commands on a fresh machine:  `make run` (set up, train the default)  and  `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch goes in first, pinned, so the project's `torch>=2.6` range never pulls a multi-GB CUDA build
# onto a CPU machine. With a GPU: `make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"`,
# or create .venv with your own torch already in it: an installed torch is kept.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint clean slurm-up slurm-down

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: setup
	$(PY) -m ablate

# make test: the tests that compare no timings on 3 workers (pytest-xdist; the Slurm tests on one of them,
# the tests sharing the `trained` runs on one), then the ones that compare timings alone (-m serial).
XDIST_WORKERS ?= 3
test: setup
	$(PY) -m pytest -n $(XDIST_WORKERS) --dist loadgroup -m "not serial" $(PYTEST_ARGS)
	$(PY) -m pytest -m serial $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check src tests bench

test-fast: setup
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf runs multirun outputs .pytest_cache
