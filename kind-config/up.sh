#!/usr/bin/env bash
# The laptop path: a kind cluster with simulated GPUs running gpusched, and the demo workload.
#
#   kind-config/up.sh            # create (or reuse) the cluster "gpusched", deploy, run the demo
#   kind-config/up.sh --down     # delete the cluster
#
# Needs docker, kind and kubectl. Steps: create the cluster from kind-config/kind.yaml; build the
# images (images/*/Dockerfile; the engine's and plugin mode's only when asked) and load them into
# the nodes; advertise each worker's simulated GPUs as nvidia.com/gpu (no device plugin in kind);
# deploy manifests/overlays/fake-gpus (the node agents run --gpu-backend=fake, each worker on its
# own preset from nodeagent/gpu/presets);
# apply kind-config/workload.yaml and show where each pod went and why.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cluster="${GPUSCHED_KIND_CLUSTER:-gpusched}"
version="0.1.0"
extender_image="ghcr.io/gpusched/extender:${version}"
agent_image="ghcr.io/gpusched/node-agent:${version}"
engine_image="ghcr.io/gpusched/engine-sidecar:${version}"
plugin_image="ghcr.io/gpusched/scheduler-plugin:${version}"
ns="gpusched-system"

# GPU units each preset simulates (what a device plugin would advertise; MIG: one per instance).
declare -A preset_units=([h100]=8 [a100]=4 [l40s]=8 [mig]=3 [consumer]=1)

for cmd in docker kind kubectl; do
  command -v "$cmd" >/dev/null || { echo "error: $cmd is required" >&2; exit 1; }
done

if [[ "${1:-}" == "--down" ]]; then
  kind delete cluster --name "$cluster"
  exit 0
fi

ctx="kind-${cluster}"
k() { kubectl --context "$ctx" "$@"; }

# --- cluster ------------------------------------------------------------------------------
if ! kind get clusters | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --config "$repo/kind-config/kind.yaml" --wait 120s
fi

# --- images -------------------------------------------------------------------------------
docker build -f "$repo/images/extender/Dockerfile" -t "$extender_image" "$repo"
docker build -f "$repo/images/node-agent/Dockerfile" -t "$agent_image" "$repo"
kind load docker-image --name "$cluster" "$extender_image" "$agent_image"
# The engine image is vLLM's (several GB) and the demo pods do not run an engine: build and load
# it only when asked.
if [[ -n "${GPUSCHED_BUILD_ENGINE:-}" ]]; then
  docker build -f "$repo/images/engine-sidecar/Dockerfile" -t "$engine_image" "$repo"
  kind load docker-image --name "$cluster" "$engine_image"
fi
# Plugin mode's GpuSched kube-scheduler (manifests/overlays/plugin-mode) compiles kube-scheduler
# (minutes), and this script deploys extender mode: build and load it only when asked.
if [[ -n "${GPUSCHED_BUILD_PLUGIN:-}" ]]; then
  docker build -f "$repo/images/scheduler-plugin/Dockerfile" -t "$plugin_image" "$repo"
  kind load docker-image --name "$cluster" "$plugin_image"
fi

# --- simulated GPUs -------------------------------------------------------------------------
# No device plugin runs in kind: advertise each worker's units as the extended resource
# (https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/).
for node in $(k get nodes -l nvidia.com/gpu.present=true -o name); do
  preset="$(k get "$node" -o jsonpath='{.metadata.labels.gpusched\.io/preset}')"
  units="${preset_units[$preset]:?"no unit count for preset '$preset' in $0"}"
  k patch "$node" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"${units}\"}]"
  echo "${node#node/}: preset ${preset}, ${units} x nvidia.com/gpu"
done

# --- gpusched -------------------------------------------------------------------------------
k apply --server-side -f "$repo/manifests/crds/scheduling.x-k8s.io_podgroups.yaml"
k apply --server-side -f "$repo/manifests/crds/scheduler.grove.io_podgangs.yaml"
k create namespace "$ns" --dry-run=client -o yaml | k apply -f -
k -n "$ns" create configmap gpusched-fleet-presets --from-file="$repo/nodeagent/gpu/presets/" \
  --dry-run=client -o yaml | k apply -f -
KUBECTL="kubectl --context $ctx" "$repo/hack/telemetry-certs.sh" "$ns" "${PKI_DIR:-$HOME/.cache/gpusched/kind-telemetry-pki}"
k apply --server-side -k "$repo/manifests/overlays/fake-gpus"
k -n "$ns" rollout status deployment/gpusched-scheduler --timeout=180s
k -n "$ns" rollout status daemonset/gpusched-node-agent --timeout=180s

# --- the demo workload ----------------------------------------------------------------------
k apply -f "$repo/kind-config/workload.yaml"
sleep 10
k -n gpusched-demo get pods -o wide
for pod in $(k -n gpusched-demo get pods -o name); do
  echo
  k -n "$ns" exec deploy/gpusched-scheduler -c extender -- \
    gpusched explain "gpusched-demo/${pod#pod/}" --url http://127.0.0.1:8888 || true
done
cat <<MSG

gpusched is running in kind cluster "$cluster" (context $ctx).
  debug:   kubectl --context $ctx -n $ns port-forward deploy/gpusched-scheduler 8888  # then http://127.0.0.1:8888/debug/nodes
  remove:  $0 --down
MSG
