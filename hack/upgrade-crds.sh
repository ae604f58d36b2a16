#!/usr/bin/env bash
# Apply the CRDs of this release before `helm upgrade` (Helm installs a chart's crds/ once and never
# upgrades them) or before `kubectl apply -k` of a newer overlay.
#
# Each CRD file is applied server-side where the cluster has no such CRD, or has gpusched's: the
# live object carries app.kubernetes.io/part-of=gpusched. That one is taken over with
# --force-conflicts: `helm install` created it with an update, so Helm owns its fields and a plain
# server-side apply of a changed field fails ("conflict with "helm" … .spec.versions"). A CRD without
# the label is another project's (scheduler-plugins' PodGroup, Grove's PodGang): skipped, saying
# so — its owner upgrades it.
#
#   hack/upgrade-crds.sh [CRD-FILE...]    # default: manifests/crds/{podgroups,podgangs}
# Needs kubectl (current context, or KUBECTL="kubectl --context X").
set -euo pipefail
read -r -a kubectl <<< "${KUBECTL:-kubectl}"
crds="$(cd "$(dirname "${BASH_SOURCE[0]}")/../manifests/crds" && pwd)"
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=("$crds/scheduling.x-k8s.io_podgroups.yaml" "$crds/scheduler.grove.io_podgangs.yaml")
command -v "${kubectl[0]}" >/dev/null || { echo "upgrade-crds: ${kubectl[0]} not found (set KUBECTL)" >&2; exit 2; }

for file in "${files[@]}"; do
  name="$("${kubectl[@]}" create --dry-run=client -o jsonpath='{.metadata.name}' -f "$file")"
  if ! live="$("${kubectl[@]}" get crd "$name" --ignore-not-found \
      -o jsonpath='{.metadata.name}/{.metadata.labels.app\.kubernetes\.io/part-of}')"; then
    echo "upgrade-crds: could not read CRD $name (see above)" >&2
    exit 1
  fi
  if [[ -n "$live" && "$live" != "$name/gpusched" ]]; then
    echo "upgrade-crds: $name is not gpusched's (no label app.kubernetes.io/part-of=gpusched): left to its owner"
    continue
  fi
  "${kubectl[@]}" apply --server-side --force-conflicts -f "$file"
done
