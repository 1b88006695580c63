# Two commands: `make quickstart` (set up, run the getting-started and DDP MLP notebooks headless)
# and `make test` (set up, run every test). Both install into .venv from this repo's files.
PYTHON ?= python3
VENV ?= .venv
# torch is pinned: this pair lies on the CI machine's disk (a CUDA build that also runs on CPU).
# On a GPU machine pick your CUDA build, e.g. make setup TORCH="torch==2.11.0 torchvision==0.26.0"
TORCH ?= torch==2.14.1 torchvision==0.29.1
EXTRAS ?= all
RUNS ?= runs
PAPERMILL = $(VENV)/bin/papermill --execution-timeout 900 --no-progress-bar

.PHONY: setup quickstart test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q $(TORCH)
	echo "$(TORCH)" | tr ' ' '\n' > $(VENV)/torch-pin.txt
	$(VENV)/bin/python -m pip install -q -c $(VENV)/torch-pin.txt -e ".[$(EXTRAS)]"
	touch $@

quickstart: setup
	mkdir -p $(RUNS)
	$(PAPERMILL) notebooks/00_getting_started.ipynb $(RUNS)/00_getting_started.ipynb -p output_dir $(abspath $(RUNS))/getting_started
	$(PAPERMILL) notebooks/pytorch/ddp_mlp.ipynb $(RUNS)/ddp_mlp.ipynb -p output_dir $(abspath $(RUNS))/ddp_mlp
	@echo
	@echo "Executed notebooks: $(abspath $(RUNS))/00_getting_started.ipynb $(abspath $(RUNS))/ddp_mlp.ipynb"
	@echo "Metrics:            $(abspath $(RUNS))/getting_started/metrics.json $(abspath $(RUNS))/ddp_mlp/metrics.json"
	@echo "Loss plot:          $(abspath $(RUNS))/ddp_mlp/loss.png   MLflow store: $(abspath $(RUNS))/ddp_mlp/mlflow.db"

test: setup
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 AXOLOTL_DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 \
		$(VENV)/bin/python -m pytest
