# The README's two commands: `make run` (the whole workbook, headless) and `make test`.
PY := .venv/bin/python
PROFILE ?=
RUN_ID ?=

.PHONY: setup run unit test test-all goldens-check lint format lab goldens
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) -m tunebook run $(if $(PROFILE),--profile $(PROFILE)) $(if $(RUN_ID),--run-id $(RUN_ID))

# The quick tier: tests that need no vLLM and start no kernel or subprocess (vLLM is blocked).
unit: setup
	TUNEBOOK_NO_VLLM=1 $(PY) -m pytest -q -p no:cacheprovider -m "not vllm and not engine and not browser and not slow" tests

# Lint, every test but the extended tier (variants a cheaper test covers, Ray, the benchmarks'
# harness on a real server), then the notebooks against their goldens. CI runs this.
test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -m "not extended" tests
	$(MAKE) --no-print-directory goldens-check

# All of it, the extended tier included.
test-all: setup
	$(PY) -m pytest -q tests
	$(MAKE) --no-print-directory goldens-check

# The two families' goldens run side by side (each set's notebooks in order, as 04 and 05 read
# the earlier ones' results): 432 s against about 600 s one after the other on 2 cores. The
# second family's report is printed after the first's.
NBVAL := $(PY) -m pytest -q --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider
goldens-check:
	rm -rf tests/golden/_nbval_run tests/golden/*/_nbval_run
	@log=$$(mktemp); $(NBVAL) tests/golden/qwen3 > $$log 2>&1 & pid=$$!; \
	$(NBVAL) tests/golden --ignore=tests/golden/qwen3; first=$$?; \
	wait $$pid; second=$$?; echo "--- tests/golden/qwen3 (the second family)"; cat $$log; rm -f $$log; \
	exit $$(( first || second ))

# Regenerate the nbval goldens (the notebooks executed on the ci profile, run folder relative, and
# again on the tiny Qwen3: params/ci-qwen3.yaml); GOLDENS=ci-qwen3 remakes one set.
GOLDENS ?=
goldens: setup
	$(PY) scripts/make_goldens.py $(GOLDENS)

lint: setup
	$(PY) -m ruff check --fix . && $(PY) -m ruff format .

# JupyterLab on notebooks/ (as root too); options go through LAB_ARGS="--ip 0.0.0.0 --port 8890".
lab: setup
	bash scripts/lab.sh $(LAB_ARGS)
