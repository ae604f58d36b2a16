#!/usr/bin/env bash
# Builds the project's images from its Dockerfiles, unchanged, with Debian's buildah (no Docker
# engine here) and writes each as a docker-archive the real test node imports into containerd:
#
#   python-base  a local stand-in for the Dockerfiles' `FROM python:3.11.13-slim-bookworm`:
#                debootstrap bookworm + Debian's python3.11 (3.11.2, not 3.11.13), the host's
#                extra CA certificates trusted (pip inside RUN goes through this machine's
#                HTTPS proxy). Tagged so the FROM resolves locally; never pushed anywhere.
#   go-base      a stand-in for `FROM golang:<version>-bookworm` (images/scheduler-plugin): the
#                python-base stand-in plus this machine's Go toolchain at /usr/local/go, which must
#                be the version the Dockerfile names (GOPATH=/go and GOTOOLCHAIN=local, as the
#                official image sets them).
#   extender          images/extender/Dockerfile          -> ghcr.io/gpusched/extender:0.1.0
#   node-agent        images/node-agent/Dockerfile        -> ghcr.io/gpusched/node-agent:0.1.0
#   scheduler-plugin  images/scheduler-plugin/Dockerfile  -> ghcr.io/gpusched/scheduler-plugin:0.1.0
#                     (plugin mode's kube-scheduler; its RUN fetches modules from the Go proxy)
#
# Usage: hack/build-images.sh [extender|node-agent|scheduler-plugin ...]   (default: all three).
# Prints one line per image on stdout: `<name> <archive>`. Each archive is cached by content — a
# stand-in by its recipe (and the host CA certificates, the Go version), an image by its
# stand-in's key, its Dockerfile, .dockerignore and every file of the build context it can copy — in
# ${GPUSCHED_IMAGE_CACHE:-~/.cache/gpusched/images}, so a change to a Dockerfile or to the code
# rebuilds that image, and a broken Dockerfile fails here with buildah's own message. Only the
# stand-ins stay in buildah's storage: an image is removed from it once its archive is written.
# Needs root (buildah's overlay storage, debootstrap's chroot); hack/real-node-deps.sh installs
# buildah and debootstrap.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${GPUSCHED_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/images}"
base_ref="docker.io/library/python:3.11.13-slim-bookworm"
mirror="${GPUSCHED_DEBIAN_MIRROR:-}"
base_packages="python3.11 python3.11-venv python3-pip ca-certificates"

declare -A tags=([extender]="ghcr.io/gpusched/extender:0.1.0" [node-agent]="ghcr.io/gpusched/node-agent:0.1.0"
                 [scheduler-plugin]="ghcr.io/gpusched/scheduler-plugin:0.1.0")
# What each Dockerfile can copy from the context (.dockerignore lets in no more): its cache key.
declare -A inputs=(
  [extender]="pyproject.toml images/requirements-build.lock images/requirements-runtime.lock README.md extender nodeagent engine-sidecar gpusched_cli gpusched_api gpusched_runtime images/extender"
  [node-agent]="pyproject.toml images/requirements-build.lock images/requirements-runtime.lock README.md extender nodeagent engine-sidecar gpusched_cli gpusched_api gpusched_runtime images/node-agent"
  [scheduler-plugin]="hack/build-scheduler-plugin.sh hack/versions.env scheduler-plugin images/scheduler-plugin")
images=("$@")
((${#images[@]})) || images=(extender node-agent scheduler-plugin)
for name in "${images[@]}"; do
  [[ -n "${tags[$name]:-}" ]] || { echo "error: unknown image '$name' (build extender, node-agent or scheduler-plugin)" >&2; exit 2; }
done
[[ $(id -u) -eq 0 ]] || { echo "error: building the images needs root (buildah storage, debootstrap); run make test as root" >&2; exit 1; }
for c in buildah debootstrap sha256sum; do
  command -v "$c" >/dev/null || { echo "error: $c is missing; run 'bash hack/real-node-deps.sh' (installs buildah and debootstrap)" >&2; exit 1; }
done
mkdir -p "$cache"

# The mirror apt already uses on this machine (debootstrap needs one; nothing else is reachable).
if [[ -z "$mirror" ]]; then
  mirror="$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)"
  [[ -n "$mirror" ]] || mirror="$(sed -n 's/^deb \(http[^ ]*debian\) bookworm .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -1)"
  [[ -n "$mirror" ]] || mirror="http://deb.debian.org/debian"
fi

digest() { sha256sum | cut -c1-16; }
host_cas() { find /usr/local/share/ca-certificates -type f -name '*.crt' 2>/dev/null | sort; }

base_key="$( { echo "bookworm minbase $base_packages v1"; host_cas | while read -r f; do cat "$f"; done; } | digest)"

build_base() {
  if buildah inspect --type image --format '{{index .ImageAnnotations "gpusched.base-key"}}' "$base_ref" 2>/dev/null \
      | grep -qx "$base_key"; then
    return
  fi
  echo "building the stand-in $base_ref (debootstrap bookworm from $mirror)" >&2
  local work started
  started=$(date +%s)
  work="$(mktemp -d "${TMPDIR:-/tmp}/gpusched-base.XXXXXX")"
  # shellcheck disable=SC2064  # expand now: the trap must remove this build's folder
  trap "umount '$work/rootfs/proc' 2>/dev/null || true; rm -rf '$work'" RETURN
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; echo "error: debootstrap failed (log above)" >&2; exit 1; }
  mkdir -p "$work/rootfs/usr/local/share/ca-certificates"
  host_cas | while read -r f; do cp "$f" "$work/rootfs/usr/local/share/ca-certificates/"; done
  mount -t proc proc "$work/rootfs/proc"
  # shellcheck disable=SC2086  # the package list is words
  chroot "$work/rootfs" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends $base_packages && update-ca-certificates >/dev/null && apt-get clean \
      && rm -rf /var/lib/apt/lists/* && ln -sf /usr/bin/python3.11 /usr/local/bin/python \
      && ln -sf /usr/bin/python3.11 /usr/local/bin/python3" >"$work/chroot.log" 2>&1 \
    || { tail -20 "$work/chroot.log" >&2; echo "error: installing Python in the stand-in failed (log above)" >&2; exit 1; }
  umount "$work/rootfs/proc"
  tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
  local ctr
  ctr="$(buildah from scratch)"
  buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 --cmd python3 \
    --annotation "gpusched.base-key=$base_key" "$ctr"
  buildah commit --quiet --rm "$ctr" "$base_ref" >/dev/null
  echo "stand-in base built in $(( $(date +%s) - started )) s" >&2
}

# The Go stand-in: the Python one (Debian bookworm, the host CAs) plus this machine's Go toolchain,
# under the tag of the Dockerfile's FROM golang:<version>-bookworm; refused if the versions differ.
go_version="$(sed -n 's/^FROM golang:\([0-9.]*\)-bookworm.*/\1/p' "$repo/images/scheduler-plugin/Dockerfile")"
go_ref="docker.io/library/golang:${go_version}-bookworm"
go_key() { { echo "$base_key go-base v1"; go env GOVERSION; } | digest; }

build_go_base() {
  [[ -n "$go_version" ]] || { echo "error: images/scheduler-plugin/Dockerfile has no 'FROM golang:<version>-bookworm'" >&2; exit 1; }
  command -v go >/dev/null || { echo "error: Go $go_version is needed for the stand-in $go_ref (install Go $go_version)" >&2; exit 1; }
  [[ "$(go env GOVERSION)" == "go$go_version" ]] || {
    echo "error: images/scheduler-plugin/Dockerfile builds on golang:$go_version, this machine has $(go env GOVERSION); install Go $go_version or change the FROM line" >&2; exit 1; }
  local key
  key="$(go_key)"
  if buildah inspect --type image --format '{{index .ImageAnnotations "gpusched.base-key"}}' "$go_ref" 2>/dev/null \
      | grep -qx "$key"; then
    return
  fi
  echo "building the stand-in $go_ref (python-base + $(go env GOROOT))" >&2
  local ctr
  ctr="$(buildah from --pull=never "$base_ref")"
  buildah copy --quiet "$ctr" "$(go env GOROOT)" /usr/local/go >/dev/null
  buildah config --env GOPATH=/go --env GOTOOLCHAIN=local \
    --env PATH=/go/bin:/usr/local/go/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --annotation "gpusched.base-key=$key" "$ctr"
  buildah commit --quiet --rm "$ctr" "$go_ref" >/dev/null
}

# The files of the build context an image can copy (its `inputs`), hashed with its stand-in's key.
context_key() {
  local name="$1" stand_in="$base_key"
  [[ "$name" == scheduler-plugin ]] && stand_in="$(go_key)"
  ( cd "$repo"
    # shellcheck disable=SC2086  # the inputs are words
    { echo "$stand_in"; cat "images/$name/Dockerfile" .dockerignore
      find ${inputs[$name]} \
           -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' 2>/dev/null | LC_ALL=C sort \
        | while read -r f; do echo "$f"; cat "$f"; done
    } | digest )
}

# The scheduler-plugin image's RUN is hack/build-scheduler-plugin.sh with GPUSCHED_PLUGIN_CACHE=/out.
# Here /out is the host's cache of that script, which `make scheduler-plugin` has just filled for
# the same sources: the script inside finds its binary (same content hash: sources, script, pins,
# Go version) instead of compiling kube-scheduler again with the build's cold Go caches (~5 min).
# `docker build` of the same Dockerfile, without the volume, compiles as before.
plugin_cache="${GPUSCHED_PLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/scheduler-plugin}"
build_volumes() {
  [[ "$1" == scheduler-plugin ]] || return 0
  bash "$here/build-scheduler-plugin.sh" >/dev/null
  echo "--volume=$plugin_cache:/out"
}

build_base
[[ " ${images[*]} " == *" scheduler-plugin "* ]] && build_go_base
for name in "${images[@]}"; do
  dockerfile="images/$name/Dockerfile"
  archive="$cache/$name-$(context_key "$name").tar"
  if [[ ! -s "$archive" ]]; then
    echo "building ${tags[$name]} from $dockerfile" >&2
    started=$(date +%s)
    log="$(mktemp "${TMPDIR:-/tmp}/gpusched-build-$name.XXXXXX")"
    volumes="$(build_volumes "$name")"
    # The archive is the product; an image left in buildah's storage would turn dangling (~0.5 GB)
    # at the next build under its tag, and a disk filled by them puts the test node under DiskPressure.
    buildah rmi "${tags[$name]}" >/dev/null 2>&1 || true
    # --isolation chroot: the default OCI isolation adds iptables chains and turns on ip_forward.
    # shellcheck disable=SC2086  # no volume is an empty word list
    if ! (cd "$repo" && buildah bud --pull=never --isolation chroot --layers=false $volumes -f "$dockerfile" \
          -t "${tags[$name]}" .) >"$log" 2>&1; then
      tail -30 "$log" >&2
      echo "error: buildah could not build $dockerfile (its output above)" >&2
      rm -f "$log"
      exit 1
    fi
    if [[ -n "$volumes" ]] && ! grep -q "GpuSched kube-scheduler cached in /out/" "$log"; then
      echo "warning: the scheduler-plugin image compiled kube-scheduler again: the script's content hash inside the build differs from the host's (compare hack/build-scheduler-plugin.sh's file list with .dockerignore)" >&2
    fi
    rm -f "$log"
    rm -f "$cache/$name"-*.tar  # older contexts of this image
    buildah push --quiet "${tags[$name]}" "docker-archive:$archive.partial:${tags[$name]}" >/dev/null
    mv "$archive.partial" "$archive"
    buildah rmi "${tags[$name]}" >/dev/null
    echo "$name built in $(( $(date +%s) - started )) s; archive $(du -m "$archive" | cut -f1) MiB" >&2
    printf '%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$name" "$(( $(date +%s) - started ))" "$(du -b "$archive" | cut -f1)" \
      >>"$cache/build-times.tsv"
  fi
  echo "$name $archive"
done
