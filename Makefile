# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test test-fast lint protos bench clean fuzz

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/trackpoint demo

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check trackpoint tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	TRACKPOINT_REQUIRE_TENSORFLOW=1 $(PY) -m pytest -q

# The suite without the tests marked `slow` (multi-process jobs, many crash trials, large
# tensors), for quick iterations; `make test` runs every test, these included.
test-fast: $(VENV)/.installed-dev
	TRACKPOINT_REQUIRE_TENSORFLOW=1 $(PY) -m pytest -q -m "not slow"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check trackpoint tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Regenerate the protobuf modules from trackpoint/bundle/protos/*.proto.
protos: $(VENV)/.installed-dev
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. trackpoint/bundle/protos/*.proto

# The structured fuzzer's long run (tests/adversary/fuzz.py): 100,000 mutated checkpoints read
# and restored on two processes; `make fuzz SEED=7 CASES=20000` for another slice.
fuzz: $(VENV)/.installed-dev
	$(PY) -m tests.adversary.fuzz --cases $(or $(CASES),100000) --seed $(or $(SEED),1) --jobs 2

bench: $(VENV)/.installed-dev
	$(PY) bench/run.py
	$(PY) bench/shards.py
	$(PY) bench/distributed.py
	$(PY) bench/incremental.py
	$(PY) bench/jax_distributed.py
	$(PY) bench/training_loop.py
	$(PY) bench/transformers.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
