# Two set-up-and-go targets: `make book` and `make test`. Both create and fill .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv book test lint lab bench clean

$(STAMP): requirements.txt pyproject.toml
	bash tests/apt_need.sh "$${CC:-cc}" gcc
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 -r requirements.txt -e .
	touch $(STAMP)

venv: $(STAMP)

book: venv
	bash scripts/build_book.sh $(BIN)
	@echo "Book built: $(CURDIR)/_build/html/index.html"

lint: venv
	$(BIN)/ruff check .

test: book
	bash tests/run_all.sh

# The chapters live in JupyterLab (pinned with jupyterlab-myst in requirements.txt), set up by
# lab/ (Jupyter's config folder for this run: jupyter_lab_config.py, settings, custom.css).
# On a remote machine: make lab LAB_IP=0.0.0.0 (or an ssh tunnel to 127.0.0.1:8888).
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
lab: venv
	@echo "JupyterLab on $(LAB_IP):$(LAB_PORT): open the URL with the token printed below;"
	@echo "in a chapter, Run > Run All Cells computes its numbers and brings its sliders to life."
	JUPYTER_CONFIG_DIR=$(CURDIR)/lab LAB_IP=$(LAB_IP) LAB_PORT=$(LAB_PORT) $(BIN)/jupyter lab

bench: venv
	$(BIN)/python benchmarks/bench_rope.py

clean:
	rm -rf _build .venv
