# The README's two commands: `make run` (the whole workbook, headless) and `make test`.
PY := .venv/bin/python
PROFILE ?=
RUN_ID ?=

.PHONY: setup run test lint format lab
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) -m tunebook run $(if $(PROFILE),--profile $(PROFILE)) $(if $(RUN_ID),--run-id $(RUN_ID))

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q tests
	$(PY) -m pytest -q --nbval-lax --sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider tests/golden

lint: setup
	$(PY) -m ruff check --fix . && $(PY) -m ruff format .

lab: setup
	.venv/bin/jupyter lab notebooks/
