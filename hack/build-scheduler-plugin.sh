#!/usr/bin/env bash
# Builds the GpuSched kube-scheduler (scheduler-plugin/: upstream kube-scheduler at the pinned
# release plus the GpuSched plugin) from the Go module proxy, as kubernetes-sigs/scheduler-plugins
# builds its scheduler, with the version stamping of hack/build-control-plane.sh.
#
# Output: $GPUSCHED_PLUGIN_CACHE/<k8s version>-<hash of scheduler-plugin/'s sources>/kube-scheduler,
# reused while the sources are unchanged. Prints the binary's path on its last line of stdout; a
# failed build exits non-zero with Go's output on stderr. Go's build and module caches are the
# user's defaults, so a rebuild after a plugin change recompiles only the plugin and the link.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
src="$repo/scheduler-plugin"

# The module must pin the release hack/versions.env names, with every staging replace at v0.x.
staging_minor="v0.${KUBERNETES_VERSION#v1.}"   # v1.37.2 -> v0.37.2
grep -qE "^[[:space:]]*k8s.io/kubernetes ${KUBERNETES_VERSION}\$" "$src/go.mod" || {
  echo "error: scheduler-plugin/go.mod does not require k8s.io/kubernetes ${KUBERNETES_VERSION} (hack/versions.env)" >&2; exit 1; }
if grep -E '^[[:space:]]*k8s.io/[^ ]+ => k8s.io/[^ ]+ v' "$src/go.mod" | grep -vq " ${staging_minor}\$"; then
  echo "error: scheduler-plugin/go.mod replaces a staging module with a version other than ${staging_minor}" >&2; exit 1
fi

# scheduler-plugin/'s files: git's view in a work tree (tracked, and untracked but not ignored),
# every file elsewhere -- an image build's context has no .git (images/scheduler-plugin/Dockerfile).
plugin_files() {
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$repo" ls-files -co --exclude-standard -- scheduler-plugin
  else
    (cd "$repo" && find scheduler-plugin -type f)
  fi
}

# Content hash of what the binary is built from (sources, go.mod/go.sum, this script, the pins).
hash="$(cd "$repo" && { plugin_files | LC_ALL=C sort | while read -r f; do
  [[ -f "$f" ]] && printf '%s %s\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)"; done
  sha256sum < hack/build-scheduler-plugin.sh; sha256sum < hack/versions.env; go env GOVERSION; } | sha256sum | cut -c1-16)"
cache_root="${GPUSCHED_PLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/scheduler-plugin}"
out="$cache_root/${KUBERNETES_VERSION}-${hash}"
if [[ -x "$out/kube-scheduler" ]]; then
  echo "GpuSched kube-scheduler cached in $out" >&2
  echo "$out/kube-scheduler"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is required to build the GpuSched kube-scheduler (install Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
echo "building the GpuSched kube-scheduler (k8s ${KUBERNETES_VERSION}, sources ${hash})" >&2
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) \
 -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$src" && go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/kube-scheduler" ./cmd/kube-scheduler) >&2; then
  echo "error: building scheduler-plugin/cmd/kube-scheduler failed (Go's output above)" >&2
  exit 1
fi
"$tmp/kube-scheduler" --version >&2
rm -rf "$out" && mv "$tmp" "$out"
trap - EXIT
echo "$out/kube-scheduler"
