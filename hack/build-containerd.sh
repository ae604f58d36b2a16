#!/usr/bin/env bash
# Builds containerd 2 (containerd, its runc shim and ctr) from the Go module proxy, for the real
# test node's DRA test: the kubelet hands a DRA plugin's CDI device ids to the runtime in the CRI
# request, and only a runtime with CDI (containerd >= 1.7; on by default in 2.x) turns them into
# container edits. Debian 12's containerd 1.6.20 ignores them.
#
# Why from source: this machine reaches the Go module proxy but no release download site. Built
# inside the downloaded module with its own go.mod/go.sum, CGO_ENABLED=0 (as containerd's own
# static builds; btrfs needs cgo, so no_btrfs), the version stamped as containerd's Makefile does.
#
# Output: $GPUSCHED_CONTAINERD_CACHE/containerd-<version>/{containerd,containerd-shim-runc-v2,ctr};
# binaries already there are reused. Prints that folder's path on its last line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${GPUSCHED_CONTAINERD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/containerd}"
out="$cache_root/containerd-${CONTAINERD_VERSION}"
bins=(containerd containerd-shim-runc-v2 ctr)

complete() { for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done; }
if complete; then
  echo "containerd ${CONTAINERD_VERSION} cached in $out" >&2
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is required to build containerd (install Go >= 1.26)" >&2; exit 1; }
module=github.com/containerd/containerd/v2
src="$(GOFLAGS=-mod=mod go mod download -json "$module@${CONTAINERD_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[[ -d "$src" ]] || { echo "error: could not download $module@${CONTAINERD_VERSION}" >&2; exit 1; }
echo "building containerd ${CONTAINERD_VERSION} (${bins[*]}) from the Go module proxy" >&2
mkdir -p "$out"
ldflags="-s -w -X $module/version.Version=${CONTAINERD_VERSION} -X $module/version.Package=$module"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
cd "$src"
for b in "${bins[@]}"; do
  [[ -x "$out/$b" ]] && continue
  tags="urfave_cli_no_docs no_btrfs osusergo netgo static_build"
  [[ $b == containerd-shim-runc-v2 ]] && tags="$tags no_grpc"
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/$b.tmp" "./cmd/$b" >&2
  mv "$out/$b.tmp" "$out/$b"
done

complete || { echo "error: build finished but binaries are missing in $out" >&2; exit 1; }
"$out/containerd" --version >&2
echo "$out"
