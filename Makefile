# LLM efficiency, measured: one environment, three commands.
#   make test   bootstrap .venv (once) and run the whole test suite (what CI runs), on two workers
#   make test-fast  the unit tier alone: no notebook, browser, process-launching, tooling or slow test (under 2 minutes)
#   make lab    bootstrap .venv (once) and start JupyterLab on notebooks/
#   make run    bootstrap .venv (once) and execute every notebook headlessly, with a report
#   make site   run the course in smoke (or take RUN=runs/<folder>) and build it as a website, offline, in runs/site/html
# The profile is picked by the device: "full" on CUDA, "smoke" on CPU (override: make run PROFILE=smoke).

PYTHON ?= python3
VENV   ?= .venv
# The torch build to install. The pin keeps every machine on the release the course was tested
# with; on a GPU box PyPI's wheel for Linux is a CUDA build. Override e.g. TORCH="torch>=2.6".
TORCH  ?= torch==2.13.0
PROFILE ?= auto
ARGS   ?=

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast lab run site strip clean-venv

# The marker alone does not prove the environment works: if .venv/bin/python is gone or broken (deleted,
# or the system Python it links to was upgraded), the marker is treated as stale and the venv rebuilt.
VENV_OK := $(shell $(PY) -c "" >/dev/null 2>&1 && echo yes)
ifneq ($(VENV_OK),yes)
.PHONY: $(STAMP)
endif

$(STAMP): pyproject.toml
	@$(PY) -c "" >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)
	@echo "environment ready in $(VENV)"

# The browser suite (tests/browser) drives JupyterLab in Debian's Chromium; without it, it is skipped.
CHROMIUM ?= $(or $(COURSE_CHROMIUM),/usr/bin/chromium)

# Two parts: the suite on JOBS workers (pytest-xdist, a file per worker at a time: the notebooks run on one torch
# thread each, so two cores run two files; in collection order, which tests/conftest.py begins with the browser
# suite, the longest file), then the tests marked `serial` alone, since they load the cores
# themselves. The under-load comparison runs its quiet side there too, alone: a notebook run beside the other
# worker is not a quiet run. Exit 5 ("no test collected": ARGS picked no serial test) counts as a pass.
JOBS ?= 2

test: $(STAMP)
	@test -x "$(CHROMIUM)" || echo "make test: no Chromium at $(CHROMIUM), so the browser suite (tests/browser) is SKIPPED; install it with 'apt-get install --no-install-recommends chromium' (or set COURSE_CHROMIUM) to run it"
	COURSE_CHROMIUM="$(CHROMIUM)" $(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not serial" $(ARGS); \
	  first=$$?; \
	  COURSE_CHROMIUM="$(CHROMIUM)" $(PY) -m pytest -m serial $(ARGS); \
	  second=$$?; [ $$second -eq 5 ] && second=0; \
	  exit $$(( first != 0 ? first : second ))

# the unit tier: what a contributor runs after each change; the markers are declared in pyproject.toml
FAST := not notebook and not browser and not ranks and not tooling and not slow

test-fast: $(STAMP)
	$(PY) -m pytest -m "$(FAST)" $(ARGS)

# cloud GPU containers often run as root, which JupyterLab refuses without --allow-root
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(LAB_ROOT_FLAG)

run: $(STAMP)
	$(PY) -m helpers.course.run $(if $(filter-out auto,$(PROFILE)),--profile $(PROFILE)) $(ARGS)

# The course as a static website (Sphinx + myst-nb, nothing fetched): a fresh smoke run of every notebook (ARGS picks
# some; PROFILE=full on a GPU), or the run folder RUN=runs/<folder>; pages in $(SITE)/html. A run in which a notebook
# failed still gets its site (that page says so); a usage error or an interrupted run does not.
SITE ?= runs/site
RUN  ?=

site: $(STAMP)
ifeq ($(RUN),)
	@$(PY) -m helpers.course.run --profile $(if $(filter-out auto,$(PROFILE)),$(PROFILE),smoke) $(ARGS); code=$$?; \
	  if [ $$code -gt 1 ]; then exit $$code; fi; \
	  $(PY) -m helpers.course.site --out $(SITE)
else
	$(PY) -m helpers.course.site --run $(RUN) --out $(SITE)
endif

# before committing a notebook: outputs, execution counts and widget state out
strip: $(STAMP)
	$(PY) -m helpers.course.strip notebooks/*.ipynb

clean-venv:
	rm -rf $(VENV)
