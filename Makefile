# make demo | make test | make test-fast | make test-newest | make bench | make bench-parts | make bench-gate | make lint | make lab
# | make conformance | make docs — each sets up its virtual environment on first use.
PYTHON ?= python3
# The torch build to install; a machine with a GPU may choose another, e.g.
# make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
# or any supported release: make test TORCH=torch==2.15.0 VENV=.venv-2.15
TORCH ?= torch==2.13.0
# The newest torch nbrpc supports, tested in an environment of its own (make test-newest).
NEWEST_TORCH ?= torch==2.15.0
# Python writes what it compiles, where PYTHONDONTWRITEBYTECODE says not to: pytest keeps
# its rewritten test modules so (collecting the tests took 26 s of CPU each time without,
# 15 with, and CI collects them a dozen times).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.nbrpc-installed
# --compile-bytecode: what each install adds, as pip does (the tests' Unix users cannot
# write the .pyc files later, and where PYTHONDONTWRITEBYTECODE is set nobody does: every
# import compiles again).
UV_INSTALL = $(VENV)/bin/uv pip install --python $(PY) --quiet --compile-bytecode
# torch with uv, from the wheels pip is told of where there are (PIP_FIND_LINKS, or pip's own
# configuration: the default release's wheel on this machine's disk), else from PyPI.
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
TORCH_INSTALL ?= $(UV_INSTALL) $(addprefix --find-links ,$(FIND_LINKS))
# The newest torch's environment: torch from PyPI (2.8 GB), which uv fetches side by side
# (43 s against pip's 81 here, the same CPU).
NEWEST := VENV=.venv-newest TORCH="$(NEWEST_TORCH)"
DOCS_READY := $(VENV)/.nbrpc-docs-installed

.PHONY: demo test test-serial test-beside test-notebooks test-fast test-newest test-newest-parallel test-newest-serial newest-env test-runtime test-runtime-parallel test-runtime-serial bench bench-parts bench-gate lint lab conformance docs clean

# Installing builds the JupyterLab extension (labextension/, with jlpm): Node.js is needed here.
$(READY): pyproject.toml labextension/package.json labextension/yarn.lock
	command -v node >/dev/null || bash .ci/system-packages.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch (TORCH_INSTALL), then the rest, both with uv: the same packages as pip's,
	# downloaded side by side (5 minutes with pip, 1.5 with uv, on 2 cores).
	$(PY) -m pip install --quiet uv
	$(TORCH_INSTALL) $(TORCH)
	$(UV_INSTALL) -e ".[test,tutorials]"
	# nbrpc's own modules too: uv compiles what it installs, and nbrpc is installed editable.
	$(PY) -m compileall -q nbrpc nbrpc_server
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(READY)

demo: $(READY)
	$(VENV)/bin/nbrpc run tutorials/00_quickstart.ipynb --output build/00_quickstart.ipynb

# Three test files at once (pytest-xdist; a file's tests stay in one process, and the files
# that share the machine's users and daemons run one at a time), then the ``serial`` ones
# one at a time, those about the machine as a whole first and alone (tests/conftest.py
# says which and why); PARALLEL=0 runs all serially. Three, on 2 cores: the parallel tier's
# files wait on kernels, hubs and Slurm much of the time (at 2 its CPU stood idle 10-18%).
PARALLEL ?= 3
XDIST := $(if $(filter-out 0,$(PARALLEL)),-n $(PARALLEL) --dist loadfile)
# The notebooks under nbval, two at once (--dist loadscope keeps a notebook's cells in
# order in one kernel, as nbval asks), but one at a time, as serial tests, those about hangs,
# whose findings come within seconds, and those that assert what a timing reads (tutorial 03:
# the observers wait on the agent for most of an episode; beside the serial tests, at the idle
# priority, a starved observer's own steps read 27%). Two: beside the serial tests, three starved a
# lab's workers long enough for its hang watcher to show a member frozen.
# Each notebook's kernel on Unix sockets (tests/unix_socket_kernels.py says why).
NBVAL := $(PY) -m pytest -p no:cacheprovider -p tests.unix_socket_kernels --nbval \
	--nbval-sanitize-with tutorials/sanitize.cfg
NOTEBOOKS := tutorials/*.ipynb tutorials/labs/source
ALONE_NOTEBOOKS := tutorials/03_reinforcement_learning.ipynb tutorials/07_when_rpc_hangs.ipynb \
	tutorials/labs/source/09_hangs
NBVAL_XDIST := $(if $(filter-out 0,$(PARALLEL)),-n 2 --dist loadscope)

# What runs beside the serial tests, at the idle priority (.ci/beside.sh): the tests marked
# ``beside`` and the notebooks, but ``ALONE_NOTEBOOKS``, which run after the serial tests at
# their priority. CI adds the lint, the docs and the newest torch's parallel tests
# (.ci/beside-serial.sh), and its serial ones after ALONE_NOTEBOOKS (AFTER_SERIAL). With
# PARALLEL=0 nothing runs beside. BESIDE_SERIAL= (empty) runs them after the serial tests instead.
BESIDE_SERIAL ?= $(MAKE) test-beside test-notebooks
BESIDE := $(if $(filter-out 0,$(PARALLEL)),$(BESIDE_SERIAL))
AFTER_SERIAL ?=
# The ``beside`` tests two at once, test by test (their files share no cluster).
BESIDE_XDIST := $(if $(filter-out 0,$(PARALLEL)),-n 2 --dist load)

test: $(READY)
	bash .ci/system-packages.sh
	$(PY) -m pytest tests -m "not serial and not beside" $(XDIST) --durations=25
	$(PY) -m pytest tests -m "serial and machine_wide" --durations=10
	bash .ci/beside.sh '$(BESIDE)' $(MAKE) test-serial
	$(if $(BESIDE),,$(MAKE) test-beside test-notebooks)

# The serial tests, then ALONE_NOTEBOOKS at the same priority (what runs beside them takes
# only the CPU they leave idle), then AFTER_SERIAL.
test-serial: $(READY)
	$(PY) -m pytest tests -m "serial and not machine_wide" --durations=25
	$(NBVAL) $(ALONE_NOTEBOOKS)
	$(AFTER_SERIAL)

# NBRPC_FROZEN_AFTER=30: beside the serial tests, at the idle priority, a worker may leave
# the hang watch's probes unanswered for over its 3 s, and a long cell then shows it as
# frozen: a lab's (labs 03 and 08) and an upstream program's (batch_parameter_server's
# trainer, in CI). No page or test run here stages a frozen member; the notebooks about
# hangs run with the default.
test-beside: $(READY)
	NBRPC_FROZEN_AFTER=30 $(PY) -m pytest tests -m beside $(BESIDE_XDIST) --durations=10

# A notebook's kernel may wait there over nbval's 60 s to start (once in CI on a slow
# machine: every cell of tutorial 01 "didn't respond in 60 seconds"): 180 s.
test-notebooks: $(READY)
	NBRPC_FROZEN_AFTER=30 $(NBVAL) $(NBVAL_XDIST) --nbval-kernel-startup-timeout=180 $(addprefix --deselect=,$(ALONE_NOTEBOOKS)) $(NOTEBOOKS)

lint: $(READY)
	$(VENV)/bin/ruff check nbrpc nbrpc_server tests benchmarks conformance docs
	# The extension's TypeScript, CSS and settings schema: prettier and ESLint as JupyterLab's
	# extension template sets them, then its Jest unit tests (the start form's line, the member table).
	cd labextension && export PATH="$(abspath $(VENV))/bin:$$PATH" && jlpm install --silent && jlpm lint:check && jlpm test --silent

# The fast tier: no notebooks, browser, network namespaces, GPU or slow tests (minutes, not an hour).
FAST := not slow and not browser and not netns and not gpu
test-fast: $(READY)
	$(PY) -m pytest tests -m "$(FAST) and not serial" $(XDIST)
	$(PY) -m pytest tests -m "$(FAST) and serial"

# What can differ under the newest supported torch, in .venv-newest: the tests marked
# ``torch_version`` (tests/conftest.py: the compat checks, every private name read on this
# torch, the call path, the upstream corpus, membership, a sample of torch's own RPC tests
# through nbrpc, the differential check), not the whole suite again.
test-newest: test-newest-parallel test-newest-serial
test-newest-parallel test-newest-serial:
	$(MAKE) $(subst newest,runtime,$@) $(NEWEST)

# Only the newest torch's environment (CI installs it beside the serial tests).
newest-env:
	$(MAKE) .venv-newest/.nbrpc-installed $(NEWEST)

RUNTIME := torch_version and not gpu and not browser and not netns and not hub
test-runtime: test-runtime-parallel test-runtime-serial
test-runtime-parallel: $(READY)
	$(PY) -c "import torch; print('torch', torch.__version__)"
	$(PY) -m pytest tests -m "$(RUNTIME) and not serial" $(XDIST) --durations=15
test-runtime-serial: $(READY)
	$(PY) -m pytest tests -m "$(RUNTIME) and serial" --durations=15

# Writes benchmarks/results.json and prints its table (missed targets show there); exits
# non-zero only when a part failed to run. Then the CUDA recipe (it says "skipped" without a GPU).
bench: $(READY)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/cuda_rpc.py

# Where a call's cost goes: the user's loops with one part of nbrpc's call path left out at a time.
bench-parts: $(READY)
	$(PY) benchmarks/parts.py
	$(PY) benchmarks/phases.py

# Fails where a row of benchmarks/results.json got worse than benchmarks/baseline.json, the
# last accepted run, by more than the runs' own spread (see benchmarks/gate.py).
bench-gate: $(READY)
	$(PY) benchmarks/gate.py

# torch's own RPC test suites, raw and with nbrpc's patches, side by side; 1 to 3 hours on 2 cores, more on a busy machine.
# First the differential check (tests/test_differential.py) with many more generated messages than make test draws.
conformance: $(READY)
	NBRPC_DIFFERENTIAL_EXAMPLES=2000 $(PY) -m pytest -p no:cacheprovider tests/test_differential.py
	$(PY) conformance/run.py

$(DOCS_READY): $(READY)
	$(UV_INSTALL) -e ".[docs]"
	touch $(DOCS_READY)

# The site in docs/_build/html: warnings are errors (-W), every reference must resolve (-n),
# then every link between its pages and every anchor is checked, offline.
docs: $(DOCS_READY)
	rm -rf docs/_build/html
	$(VENV)/bin/sphinx-build -W -n --keep-going -q -b html docs docs/_build/html
	$(PY) docs/_ext/check_links.py docs/_build/html

lab: $(READY)
	$(UV_INSTALL) -e ".[lab]"
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --notebook-dir tutorials

clean:
	rm -rf .venv .venv-newest build docs/_build docs/generated
