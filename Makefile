# Every target does its own set-up on a fresh machine: .venv, torch (the local CPU wheel), the package, the model.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
MODEL := smollm2-135m-instruct

.PHONY: setup model test lint demo bench clean

$(BIN)/depthlens: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

setup: $(BIN)/depthlens

model: setup
	$(BIN)/depthlens models --install $(MODEL)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports

test: model lint
	$(BIN)/python -m pytest -q

demo: model
	$(BIN)/depthlens score --model $(MODEL) --in examples/samples.jsonl --out runs/demo/scores.jsonl --tokens --overwrite
	$(BIN)/python examples/show_scores.py runs/demo/scores.jsonl --record apples --png runs/demo/heatmap.png

bench: model
	$(BIN)/python benchmarks/readout.py --out docs/benchmarks/readout.json

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
