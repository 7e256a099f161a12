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
	rm -rf _build/html _build/.jupyter_cache _build/jupyter_execute
	timeout 1800 $(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Book built: $(CURDIR)/_build/html/index.html"

lint: venv
	$(BIN)/ruff check .

test: book
	bash tests/run_all.sh

lab: venv
	$(BIN)/python -m pip install --quiet "jupyterlab>=4,<5"
	$(BIN)/jupyter lab book/

bench: venv
	$(BIN)/python benchmarks/bench_rope.py

clean:
	rm -rf _build .venv
