# make demo | make test | make test-fast | make bench | make lint | make lab | make conformance — each sets up .venv on first use.
PYTHON ?= python3
# The torch build to install; a machine with a GPU may choose another, e.g.
# make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.nbrpc-installed

.PHONY: demo test test-fast bench lint lab conformance clean

# Installing builds the JupyterLab extension (labextension/, with jlpm): Node.js is needed here.
$(READY): pyproject.toml labextension/package.json labextension/yarn.lock
	command -v node >/dev/null || bash .ci/system-packages.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[test,tutorials]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(READY)

demo: $(READY)
	$(VENV)/bin/nbrpc run tutorials/00_quickstart.ipynb --output build/00_quickstart.ipynb

test: $(READY)
	bash .ci/system-packages.sh
	$(PY) -m pytest tests
	$(PY) -m pytest -p no:cacheprovider --nbval --nbval-sanitize-with tutorials/sanitize.cfg --ignore=tutorials/labs tutorials
	$(PY) -m pytest -p no:cacheprovider --nbval --nbval-sanitize-with tutorials/sanitize.cfg tutorials/labs/source

lint: $(READY)
	$(VENV)/bin/ruff check nbrpc tests benchmarks conformance
	# The extension's TypeScript and CSS, in the template's prettier style (node_modules: made by the build).
	cd labextension && ../$(VENV)/bin/jlpm install --silent && ../$(VENV)/bin/jlpm prettier:check

# The fast tier: no notebooks, browser, network namespaces, GPU or slow tests (minutes, not an hour).
test-fast: $(READY)
	$(PY) -m pytest tests -m "not slow and not browser and not netns and not gpu"

# Exits non-zero when a target row fails (after the CUDA recipe has run too).
bench: $(READY)
	status=0; $(PY) benchmarks/run.py || status=$$?; $(PY) benchmarks/cuda_rpc.py && exit $$status

# torch's own RPC test suites, raw and with nbrpc's patches, side by side; 1 to 3 hours on 2 cores, more on a busy machine.
conformance: $(READY)
	$(PY) conformance/run.py

lab: $(READY)
	$(PY) -m pip install --quiet -e ".[lab]"
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --notebook-dir tutorials

clean:
	rm -rf $(VENV) build
