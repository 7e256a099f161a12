# Two set-up-and-go targets: `make book` and `make test`. Both create and fill .venv.
# The book is built once per change of its sources: `make test` right after `make book`
# reuses _build/html. `make test-lib`: ruff and ropelib's tests alone, no book.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv book test test-lib lint lab bench clean

$(STAMP): requirements.txt pyproject.toml
	bash tests/apt_need.sh "$${CC:-cc}" gcc
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 -r requirements.txt -e .
	touch $(STAMP)

venv: $(STAMP)

# What the build reads: the chapters and their configuration, and ropelib (imported by them).
BOOK_SOURCES := _config.yml _toc.yml $(wildcard book/*.ipynb book/*.md book/*.bib book/*.py \
	book/_ext/*.py _static/*) $(shell find ropelib -name '*.py' -o -name '*.c')
BOOK_BUILT := _build/html/.built

$(BOOK_BUILT): $(STAMP) $(BOOK_SOURCES)
	bash scripts/build_book.sh $(BIN)
	touch $@

book: $(BOOK_BUILT)
	@echo "Book built: $(CURDIR)/_build/html/index.html"

lint: venv
	$(BIN)/ruff check .

test: book
	bash tests/run_all.sh

# The tests of the book (its pages, cells, notebooks, browser) are left out.
BOOK_TESTS := $(wildcard tests/test_book_*.py) tests/test_chapter_cells.py \
	tests/test_lab_browser.py tests/test_bibliography.py tests/test_notebook_store.py \
	tests/test_kernel_watchdog.py tests/test_portable_kernels.py
test-lib: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q tests $(addprefix --ignore=,$(BOOK_TESTS)) --durations=10

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
