# Fresh machine: `make demo` records the examples and shows the record; `make test` runs the suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= .auditlog

.PHONY: venv install demo test test-fast lint lint-imports typecheck docs bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is installed first and pinned: an unpinned torch can pull a multi-GB CUDA build.
# The stamp makes `make test` install only when pyproject.toml changed.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

install: venv

demo: venv
	$(BIN)/auditlog run --snapshot-every 4 examples/train_mlp.py --epochs 2
	$(BIN)/auditlog run examples/train_cnn.py --epochs 2
	$(BIN)/auditlog runs
	$(BIN)/auditlog events latest~1 --kind module_registered --limit 8
	$(BIN)/auditlog events latest~1 --kind optimizer_step --step 1:3
	$(BIN)/auditlog tree latest~1 --step 4
	$(BIN)/auditlog query --run latest~1 "select step, round(sqrt(sum(grad_norm * grad_norm)), 4) as grad_norm from steps group by step order by step limit 5"
	$(BIN)/auditlog verify all

# Two workers, a file each at a time (module fixtures are built once): the suite is
# mostly subprocesses starting torch, which two cores overlap. TEST_JOBS=0 runs it serially.
TEST_JOBS ?= 2

test: venv
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# Development loop: everything but the subprocess-heavy tests (marked slow).
test-fast: venv
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not slow"

lint: venv lint-imports typecheck
	$(BIN)/ruff check auditlog cli migrations tests examples benchmarks
	$(BIN)/ruff format --check auditlog cli migrations tests examples benchmarks

# Import contracts (pyproject [tool.importlinter]) on a copy laid out as installed
# (cli/ as auditlog.cli: tests/importcontracts.py).
lint-imports: venv
	$(BIN)/python tests/importcontracts.py

typecheck: venv
	$(BIN)/mypy auditlog
	$(BIN)/mypy cli

docs: venv
	$(BIN)/python -m auditlog.cli.reference --write docs

bench: venv
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/overhead.py --models fast --no-peers
	$(BIN)/python benchmarks/bytecodes.py --models fast
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/snapshots.py
	$(BIN)/python benchmarks/snapshot_stall.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/reads.py
	$(BIN)/python benchmarks/verify.py
	$(BIN)/python benchmarks/snapshot_check.py
	$(BIN)/python benchmarks/replay.py
	$(BIN)/python benchmarks/registrations.py
	$(BIN)/python benchmarks/forensics.py
	$(BIN)/python benchmarks/writers.py
	$(BIN)/python benchmarks/ui.py

clean:
	rm -rf $(VENV) $(STORE) build *.egg-info
