#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager), kubectl and
# the kubelet and kube-proxy of the real test node from the Go module proxy.
#
# Why from source: the tests run against the real components, and this machine can reach the
# Go module proxy but no release download site. The build follows kubernetes-sigs/scheduler-plugins:
# a throwaway go.mod that requires k8s.io/kubernetes at one pinned release and replaces every
# k8s.io/* staging module (declared `=> ./staging/...` upstream) with the matching v0.x release.
#
# Output: $GPUSCHED_BIN_CACHE/<k8s>-<etcd>/{etcd,kube-apiserver,kube-scheduler,kubectl,kubelet,kube-controller-manager,kube-proxy}; binaries
# already in the cache folder are reused, missing ones are built (so adding one to the list does
# not rebuild the others). Prints that folder's path on its last line of stdout.
# The Go build cache (GOCACHE) and module cache (GOMODCACHE) are the user's defaults, so later
# runs on the same machine reuse them too.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# Outside the checkout, so fresh clones (CI) on the same machine reuse it.
cache_root="${GPUSCHED_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/control-plane}"
out="$cache_root/${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
k8s_bins=(kube-apiserver kube-scheduler kubectl kubelet kube-controller-manager kube-proxy)
bins=(etcd "${k8s_bins[@]}")

complete() { for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done; }
missing_k8s=()
for b in "${k8s_bins[@]}"; do [[ -x "$out/$b" ]] || missing_k8s+=("$b"); done
if complete; then
  echo "control plane binaries cached in $out" >&2
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is required to build the test control plane (install Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpusched-cp-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

staging_minor="v0.${KUBERNETES_VERSION#v1.}"   # v1.37.2 -> v0.37.2
echo "building ${missing_k8s[*]:-} ${KUBERNETES_VERSION} (staging ${staging_minor})$([[ -x "$out/etcd" ]] || echo " and etcd ${ETCD_VERSION}")" >&2

# --- Kubernetes -----------------------------------------------------------------------------
if ((${#missing_k8s[@]})); then
mkdir -p "$work/k8s"
cd "$work/k8s"
cat > go.mod <<MOD
module gpusched.local/controlplane

go 1.26.0

require k8s.io/kubernetes ${KUBERNETES_VERSION}
MOD
upstream_mod="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[[ -f "$upstream_mod" ]] || { echo "error: could not download k8s.io/kubernetes@${KUBERNETES_VERSION} go.mod" >&2; exit 1; }
staging=$(grep -E '=> \./staging/' "$upstream_mod" | awk '{print $1}')
[[ -n "$staging" ]] || { echo "error: no staging replaces found in $upstream_mod" >&2; exit 1; }
{
  echo "replace ("
  for m in $staging; do echo "  $m => $m ${staging_minor}"; done
  echo ")"
} >> go.mod
cat > tools.go <<'GO'
//go:build tools

package tools
GO
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) \
 -X k8s.io/component-base/version.gitTreeState=clean"
pkgs=()
for b in "${missing_k8s[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
go get "${pkgs[@]/%/@${KUBERNETES_VERSION}}" >&2
go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" >&2
fi

# --- etcd -------------------------------------------------------------------------------------
if [[ ! -x "$out/etcd" ]]; then
mkdir -p "$work/etcd"
cd "$work/etcd"
cat > go.mod <<MOD
module gpusched.local/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
MOD
go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 >&2
fi

complete || { echo "error: build finished but binaries are missing in $out" >&2; exit 1; }
# Each binary's version, as the build log's last word on what was built (kubectl has no --version flag).
for b in "${bins[@]}"; do
  if [[ "$b" == kubectl ]]; then "$out/$b" version --client >&2; else "$out/$b" --version >&2; fi
done
echo "$out"
