#!/usr/bin/env bash
# The host packages the tests need: for the real test node containerd and runc (Debian's; the
# kubelet needs CRI v1 only), the CNI plugins, iptables and conntrack (the kubelet's chains),
# buildah and debootstrap (the project's images, built from its Dockerfiles without a Docker
# engine); for the fleet page's browser test Debian's chromium and its chromedriver. Installs what
# is missing with apt when it can; when it cannot (not root, no apt), fails saying exactly that —
# the tests never skip.
set -euo pipefail

need_cmds=(containerd runc ctr iptables conntrack buildah debootstrap chromium chromedriver)
need_files=(/usr/lib/cni/host-local /usr/lib/cni/bridge /usr/lib/cni/loopback)
packages=(containerd runc containernetworking-plugins iptables conntrack buildah debootstrap chromium chromium-driver)

missing=()
for c in "${need_cmds[@]}"; do command -v "$c" >/dev/null || missing+=("$c"); done
for f in "${need_files[@]}"; do [[ -x "$f" ]] || missing+=("$f"); done
if ((${#missing[@]} == 0)); then
  echo "real-node packages present" >&2
  exit 0
fi

echo "real-node packages missing: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  echo "error: the real test node needs ${packages[*]} (Debian packages), and installing them needs root;" \
       "run 'sudo apt-get install ${packages[*]}' or run make test as root" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: the real test node needs ${packages[*]} and this machine has no apt-get; install them with" \
       "the system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
# Debian starts containerd as a service where a service manager runs; the harness runs its own
# instance with its own config, sockets and state, so a system one must not hold the defaults.
for c in "${need_cmds[@]}"; do command -v "$c" >/dev/null || { echo "error: $c still missing after apt-get install" >&2; exit 1; }; done
echo "real-node packages installed" >&2
