# Two commands: `make quickstart` (set up, run the getting-started and DDP MLP notebooks headless)
# and `make test` (set up, run every test). Both install into .venv from this repo's files.
PYTHON ?= python3
# The environments install two at a time (pip waits on downloads and unpacking as much as on the CPU).
MAKEFLAGS += --jobs=2
VENV ?= .venv
# torch is pinned: the newest pair (a CUDA 13.2 build that also runs on CPU; 2.9 GB from PyPI with its CUDA libraries).
# On a GPU machine pick your CUDA build, e.g. make setup TORCH="torch==2.11.0 torchvision==0.26.0"
TORCH ?= torch==2.15.0 torchvision==0.29.2
EXTRAS ?= all
# The quickstart's two notebooks need torch, the package itself and papermill (the `dev` extra): no torchvision,
# no Hugging Face stack. torch 2.13.0 is the CPU build on the CI machine's disk (about 0.9 GB installed).
QUICKSTART_TORCH ?= torch==2.13.0
QUICKSTART_EXTRAS ?= dev
# Axolotl has an environment of its own (environments/axolotl/requirements.txt says why); axolotl 0.19 takes
# torch 2.11 to 2.13. CI uses 2.13.0 (the CPU build on its disk); on GPUs e.g. AXOLOTL_TORCH=torch==2.11.0
AXOLOTL_VENV ?= .venv-axolotl
AXOLOTL_TORCH ?= torch==2.13.0
# Unsloth too (environments/unsloth/requirements.txt says why): it takes torch < 2.15 and needs a torchvision that
# imports beside it: CI's is the pair on its disk (a CUDA build that also runs on CPU, about 5.3 GB installed).
UNSLOTH_VENV ?= .venv-unsloth
UNSLOTH_TORCH ?= torch==2.14.1 torchvision==0.29.1
RUNS ?= runs
# --no-compile: pip byte-compiles every module it installs one file after another (about 75,000 files in the two
# environments: 140 of the 250 CPU seconds of the installs here). COMPILE_ALL does it afterwards on every core, for
# the packages something here imports (not the Oracle cloud SDK that Axolotl brings, 18,000 files, nor the 2,400 of
# transformers' model zoo: a model's module compiles when it is first imported): about 25 s a venv on 2 cores.
# Without it each module is compiled the first time it is imported, by every process that imports it before its
# bytecode is on disk: from a fresh clone on 2 cores the tests took 1,130 to 1,380 s without it, 856 s with it, and the
# installs as long as before (2026-12-06). A file that does not compile (a template, old syntax) is one nothing
# imports: -qq leaves it.
# PYTHONDONTWRITEBYTECODE would stop the bytecode being kept: what is started from here unsets it (WRITE_BYTECODE).
PIP_INSTALL = -m pip install -q --no-compile
WRITE_BYTECODE = env -u PYTHONDONTWRITEBYTECODE
COMPILE_ALL = $(1)/bin/python -m compileall -qq -j 0 \
	-x '/(tests?|oci|diffusers|studio|plotly|lm_eval|pip)/|/transformers/models/' \
	$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || true
PAPERMILL = $(WRITE_BYTECODE) $(VENV)/bin/papermill --execution-timeout 900 --no-progress-bar

# A venv with the CUDA build of torch takes about 7.2 GB, the Axolotl one 4.6 GB; pip also unpacks wheels.
# Refuse early with advice instead of failing half-way with "No space left on device".
define need_free_gb
	@free=$$(df -Pk $(dir $(abspath $(1))) | awk 'NR==2 {print int($$4 / 1048576)}'); \
	if [ "$$free" -lt $(2) ]; then \
		echo "make: $(1) needs about $(2) GB free on its disk, $$free GB are free there." >&2; \
		echo "      Free some space (old clones, ~/.cache), or put it on a bigger disk: make $(3)=/big/disk/$(notdir $(1))" >&2; \
		exit 1; \
	fi
endef

# The torch pin for a set of extras: the quickstart's light one unless TORCH is given on the command line.
torch_for = $(if $(and $(filter $(QUICKSTART_EXTRAS),$(1)),$(filter-out command line,$(origin TORCH))),$(QUICKSTART_TORCH),$(TORCH))
# The pins that come with the default TORCH (its CUDA build's libraries): only where that pair is what installs.
torch_lock = $(if $(and $(filter file,$(origin TORCH)),$(filter $(TORCH),$(call torch_for,$(1)))),-c constraints-torch.txt)
# The quickstart runs in a venv that already has everything (after `make test`) without touching it.
QUICKSTART_STAMP = $(if $(wildcard $(VENV)/.installed-all),$(VENV)/.installed-all,$(VENV)/.installed-$(QUICKSTART_EXTRAS))

.PHONY: setup setup-axolotl setup-unsloth setup-air lock newest quickstart test
# One stamp per set of extras: `make quickstart` (dev) and then `make test` (all) installs the rest.
setup: $(VENV)/.installed-$(EXTRAS)

# constraints.txt: the lock, every distribution at the version the tests passed with, so an install a month from now
# gets them too (environments/lock.py writes it: `make lock`). constraints-torch.txt: what comes with the default TORCH.
$(VENV)/.installed-%: pyproject.toml constraints.txt constraints-torch.txt Makefile
	$(call need_free_gb,$(VENV),$(if $(filter dev,$*),2,9),VENV)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python $(PIP_INSTALL) -c constraints.txt --upgrade pip setuptools
	$(VENV)/bin/python $(PIP_INSTALL) -c constraints.txt $(call torch_lock,$*) $(call torch_for,$*)
	echo "$(call torch_for,$*)" | tr ' ' '\n' > $(VENV)/torch-pin.txt
	$(VENV)/bin/python $(PIP_INSTALL) -c $(VENV)/torch-pin.txt -c constraints.txt $(call torch_lock,$*) -e ".[$*]"
	$(call COMPILE_ALL,$(VENV))
	touch $@

# The notebook kernel `cookbook-axolotl` runs in .venv-axolotl; its spec goes into .venv, where papermill
# and Jupyter look for kernels.
setup-axolotl: $(AXOLOTL_VENV)/.installed

AXOLOTL_LOCK = -c environments/axolotl/constraints.txt $(if $(filter file,$(origin AXOLOTL_TORCH)),-c environments/axolotl/constraints-torch.txt)
$(AXOLOTL_VENV)/.installed: environments/axolotl/requirements.txt environments/axolotl/constraints.txt \
		environments/axolotl/constraints-torch.txt pyproject.toml Makefile
	$(call need_free_gb,$(AXOLOTL_VENV),6,AXOLOTL_VENV)
	test -x $(AXOLOTL_VENV)/bin/python || $(PYTHON) -m venv $(AXOLOTL_VENV)
	$(AXOLOTL_VENV)/bin/python $(PIP_INSTALL) $(AXOLOTL_LOCK) --upgrade pip setuptools
	$(AXOLOTL_VENV)/bin/python $(PIP_INSTALL) $(AXOLOTL_LOCK) $(AXOLOTL_TORCH)
	echo "$(AXOLOTL_TORCH)" | tr ' ' '\n' > $(AXOLOTL_VENV)/torch-pin.txt
	$(AXOLOTL_VENV)/bin/python $(PIP_INSTALL) -c $(AXOLOTL_VENV)/torch-pin.txt $(AXOLOTL_LOCK) -r environments/axolotl/requirements.txt -e .
	$(call COMPILE_ALL,$(AXOLOTL_VENV))
	$(AXOLOTL_VENV)/bin/python -m ipykernel install --prefix $(abspath $(VENV)) --name cookbook-axolotl --display-name "Python (cookbook-axolotl)"
	touch $@

# The notebook kernel `cookbook-unsloth` runs in .venv-unsloth, with the cookbook's `unsloth` extra; its spec goes into
# .venv, as Axolotl's does.
setup-unsloth: $(UNSLOTH_VENV)/.installed

UNSLOTH_LOCK = -c environments/unsloth/constraints.txt $(if $(filter file,$(origin UNSLOTH_TORCH)),-c environments/unsloth/constraints-torch.txt)
$(UNSLOTH_VENV)/.installed: environments/unsloth/requirements.txt environments/unsloth/constraints.txt \
		environments/unsloth/constraints-torch.txt pyproject.toml Makefile
	$(call need_free_gb,$(UNSLOTH_VENV),8,UNSLOTH_VENV)
	test -x $(UNSLOTH_VENV)/bin/python || $(PYTHON) -m venv $(UNSLOTH_VENV)
	$(UNSLOTH_VENV)/bin/python $(PIP_INSTALL) $(UNSLOTH_LOCK) --upgrade pip setuptools
	$(UNSLOTH_VENV)/bin/python $(PIP_INSTALL) $(UNSLOTH_LOCK) $(UNSLOTH_TORCH)
	echo "$(UNSLOTH_TORCH)" | tr ' ' '\n' > $(UNSLOTH_VENV)/torch-pin.txt
	$(UNSLOTH_VENV)/bin/python $(PIP_INSTALL) -c $(UNSLOTH_VENV)/torch-pin.txt $(UNSLOTH_LOCK) -r environments/unsloth/requirements.txt -e ".[unsloth]"
	$(call COMPILE_ALL,$(UNSLOTH_VENV))
	$(UNSLOTH_VENV)/bin/python -m ipykernel install --prefix $(abspath $(VENV)) --name cookbook-unsloth --display-name "Python (cookbook-unsloth)"
	touch $@

# Databricks' CLI (`air`), with which the tests check each recipe's workload.yaml (environments/databricks-air says why
# it has a venv of its own). About 60 MB, 10 s.
AIR_VENV ?= .venv-air
setup-air: $(AIR_VENV)/.installed

$(AIR_VENV)/.installed: environments/databricks-air/requirements.txt environments/databricks-air/constraints.txt Makefile
	test -x $(AIR_VENV)/bin/python || $(PYTHON) -m venv $(AIR_VENV)
	$(AIR_VENV)/bin/python $(PIP_INSTALL) -c environments/databricks-air/constraints.txt --upgrade pip setuptools
	$(AIR_VENV)/bin/python $(PIP_INSTALL) -c environments/databricks-air/constraints.txt -r environments/databricks-air/requirements.txt
	touch $@

# The locks (constraints.txt and those of environments/): `make lock` keeps what is locked and resolves what is new;
# `make lock UPGRADE=1` takes the newest releases (holds kept). pip's resolver, with pip's configuration: lock.py says why.
# The resolver is the main venv's pip (the lock's own version) where the venv exists.
LOCK_PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
lock:
	$(LOCK_PYTHON) environments/lock.py $(if $(UPGRADE),--upgrade)

# The drift check: a throwaway venv with the newest release of every direct dependency (torch: TORCH), each notebook's
# smoke cases run there, what fails printed, environments/newest.txt written (environments/newest.py says more). Not part
# of `make test`: a release elsewhere must not turn CI red.
newest:
	$(PYTHON) environments/newest.py

quickstart: $(QUICKSTART_STAMP)
	mkdir -p $(RUNS)
	$(PAPERMILL) notebooks/00_getting_started.ipynb $(RUNS)/00_getting_started.ipynb -p output_dir $(abspath $(RUNS))/getting_started
	$(PAPERMILL) notebooks/pytorch/ddp_mlp.ipynb $(RUNS)/ddp_mlp.ipynb -p output_dir $(abspath $(RUNS))/ddp_mlp
	@echo
	@echo "Executed notebooks: $(abspath $(RUNS))/00_getting_started.ipynb $(abspath $(RUNS))/ddp_mlp.ipynb"
	@echo "Metrics:            $(abspath $(RUNS))/getting_started/metrics.json $(abspath $(RUNS))/ddp_mlp/metrics.json"
	@echo "Loss plot:          $(abspath $(RUNS))/ddp_mlp/loss.png   MLflow store: $(abspath $(RUNS))/mlflow.db"

# The tests run hermetically: a fresh, empty TMPDIR and HOME (caches, Ray's and Jupyter's runtime files),
# removed afterwards, so what an earlier run left on the machine (e.g. /tmp/ray) can neither make them pass
# nor fail. The installs above keep the real HOME (pip's configuration, e.g. a local index, lives there).
# PYTEST_ARGS picks tests, e.g. make test PYTEST_ARGS="tests/test_distributed.py -x".
# TEST_WORKERS pytest processes share the tests (pytest-xdist): the tests spend much of their time waiting (process
# starts, kernels, rendezvous), so three streams fit a 2-core machine (five overload it: timeouts). --dist loadfile keeps each file's tests on
# one worker: a notebook's cases live in one file with the tests that reuse their runs. --no-loadscope-reorder: the files
# in the order tests/conftest.py gives them (longest first), not xdist's most-tests-first. TEST_WORKERS=0: no xdist.
PYTEST_ARGS ?=
TEST_WORKERS ?= 3
test: setup setup-axolotl setup-unsloth setup-air
	@scratch=$$(mktemp -d "$${TMPDIR:-/tmp}/cookbook-test.XXXXXX") && trap 'rm -rf "$$scratch"' EXIT && \
	mkdir "$$scratch/tmp" "$$scratch/home" && echo "make test: TMPDIR and HOME are fresh folders in $$scratch" && \
	TMPDIR="$$scratch/tmp" HOME="$$scratch/home" \
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 AXOLOTL_DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 \
		$(WRITE_BYTECODE) $(abspath $(VENV))/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
