# lnexp: one target per step of the study. `make demo` and `make test` work on a fresh clone.
# The first supported Python found (3.11, then 3.12: ve-fairseq 0.12.3 has wheels for both), on
# PATH or under pyenv; `make install PYTHON=/path/to/python3.12` chooses one. 3.11 first: where a
# CPU wheel of torch lies on local disk it is the cp311 one (a 1.5 GB venv), while 3.12 takes PyPI's
# CUDA build (5.2 GB, docs/development.md#installation).
SUPPORTED   := 3.11 3.12
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for v in $(SUPPORTED); do \
	for p in python$$v $$(ls -d $$(pyenv root 2>/dev/null)/versions/$$v*/bin/python$$v 2>/dev/null | sort -V | tail -1); do \
	$$p -c 'import sys' >/dev/null 2>&1 && { echo $$p; exit 0; }; done; done)
endif
VENV        ?= .venv
BIN         := $(VENV)/bin
# The CPU wheel of torch is installed first so that no multi-GB CUDA build is pulled in.
# GPU users: install a CUDA build of torch into $(VENV) first and run `make install TORCH_SPEC=`.
TORCH_SPEC  ?= torch==2.13.0
# Offline install beside a machine's own torch (docs/multi-gpu.md): `make wheelhouse` writes lnexp and
# its dependencies except torch/torchaudio as wheels into WHEELS for Python PY on PLATFORM (HAVE: a
# file of packages the target already has, left out); `make install WHEELS=dir` on the target makes
# $(VENV) see the Python's own packages (its torch) and installs from the folder only (no index).
WHEELS      ?=
PY          ?= 3.12
PLATFORM    ?= manylinux_2_28_x86_64
HAVE        ?=
SCALE       ?= mini
LNEXP       := $(BIN)/lnexp
STAMP       := $(VENV)/.installed

.PHONY: install wheelhouse demo test lint fig2 fig3 fig4 atlas theory report figures bench clean-runs

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || test -n "$(PYTHON)" || { echo "make install: no Python $(subst $() ,/,$(SUPPORTED)) found; install one (e.g. pyenv install 3.11) or give PYTHON=/path/to/python3.11" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null || { echo "make install: $(PYTHON) is not a Python 3.11 or 3.12 (what lnexp supports): give PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -z "$(WHEELS)" || test -f "$(WHEELS)/wheelhouse.json" || { echo "make install: WHEELS=$(WHEELS) holds no wheelhouse (wheelhouse.json): build one with make wheelhouse WHEELS=$(WHEELS)" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(if $(WHEELS),--system-site-packages) $(VENV)
	@echo "make install: $(VENV) uses Python $$($(BIN)/python -c 'import platform; print(platform.python_version())') (supported: 3.11, 3.12)"
ifeq ($(WHEELS),)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(BIN)/python -m pip install -q "$(TORCH_SPEC)")
	$(BIN)/python -m pip install -q -e ".[dev]"
else
	$(PYTHON) -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_lnexp_base_env.pth"
	$(BIN)/python -c 'import torch; print("make install: using the installed torch", torch.__version__)'
	$(BIN)/python -m pip install -q --no-index --find-links "$(WHEELS)" -e ".[dev]"
endif
	touch $(STAMP)

wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py --out $(or $(WHEELS),wheelhouse) \
		--python-version $(PY) --platform $(PLATFORM) $(if $(HAVE),--have $(HAVE))

demo: install
	$(LNEXP) train max_epoch=2

# Two pytest workers of one thread each, a test file per worker (its module fixtures built once):
# the suite's imports, subprocess starts and tokenisers run side by side. TEST_JOBS=0 runs serially.
TEST_JOBS   ?= 2
test: install
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile)

lint: install
	$(BIN)/ruff check lnexp tests scripts

fig2: install
	$(LNEXP) train -m experiment=fig2_$(SCALE)
	$(LNEXP) train -m experiment=fig2_low_lr_$(SCALE)
	$(LNEXP) train -m experiment=fig2_sgd_$(SCALE)
	$(LNEXP) figure fig2 --scale $(SCALE)

fig3: install
	$(LNEXP) figure fig3 --scale $(SCALE)

fig4: install
	$(LNEXP) train -m experiment=fig4_$(SCALE)
	$(if $(filter paper,$(SCALE)),$(LNEXP) train -m experiment=fig4_wmt_paper)
	$(LNEXP) figure fig4 --scale $(SCALE)

# The zoo atlas (docs/atlas.md): lnexp atlas's rounds (coverage, the claims, the bisection) within
# its budget (mini: 100 min on 2 cores; ATLAS_ARGS="--budget-min N --jobs N" to change), then the
# figures. Rerunning resumes: finished runs are skipped, the budget left is spent.
ATLAS_ARGS ?=
atlas: install
	$(LNEXP) atlas --scale $(SCALE) $(ATLAS_ARGS)
	$(LNEXP) figure atlas --scale $(SCALE)

theory: install
	$(LNEXP) figure theory --scale $(SCALE)

report: install
	$(LNEXP) figure report --scale $(SCALE) --readme README.md

figures: fig3 theory fig2 fig4 report

bench: install
	$(BIN)/python scripts/bench_train.py
	$(BIN)/python scripts/bench_eval.py
	$(BIN)/python scripts/bench_startup.py

clean-runs:
	rm -rf runs figures report
