# lnexp: one target per step of the study. `make demo` and `make test` work on a fresh clone.
PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
# The CPU wheel of torch is installed first so that no multi-GB CUDA build is pulled in.
# GPU users: install a CUDA build of torch into $(VENV) first and run `make install TORCH_SPEC=`.
TORCH_SPEC  ?= torch==2.13.0
SCALE       ?= mini
LNEXP       := $(BIN)/lnexp
STAMP       := $(VENV)/.installed

.PHONY: install demo test lint fig2 fig3 fig4 atlas theory report figures bench clean-runs

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(BIN)/python -m pip install -q "$(TORCH_SPEC)")
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: install
	$(LNEXP) train max_epoch=2

test: install
	$(BIN)/python -m pytest

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

atlas: install
	$(LNEXP) train -m experiment=atlas_$(SCALE)
	$(LNEXP) train -m experiment=atlas_dt_$(SCALE)
	$(LNEXP) figure atlas --scale $(SCALE)

theory: install
	$(LNEXP) figure theory --scale $(SCALE)

report: install
	$(LNEXP) figure report --scale $(SCALE)

figures: fig3 theory fig2 fig4 report

bench: install
	$(BIN)/python scripts/bench_train.py
	$(BIN)/python scripts/bench_eval.py
	$(BIN)/python scripts/bench_startup.py

clean-runs:
	rm -rf runs figures report
