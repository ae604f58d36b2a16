#!/usr/bin/env bash
# Make the telemetry port's TLS material for a kustomize install (Helm users may set
# telemetry.tls.generate instead; cert-manager users issue the Secret themselves):
#   - a CA (kept in DIR, default ./telemetry-pki; keep ca.key safe or delete it after use),
#   - a serving certificate for gpusched-telemetry.<namespace>.svc signed by it,
#   - Secret <namespace>/gpusched-telemetry-tls (tls.crt, tls.key), read by the extender only,
#   - ConfigMap <namespace>/gpusched-telemetry-ca (ca.crt), read by the node agents.
# Idempotent: an existing CA in DIR is reused (so agents keep trusting it) and the objects are
# applied, not created. Needs openssl and kubectl (current context, or KUBECTL="kubectl --context X").
#
#   hack/telemetry-certs.sh [NAMESPACE] [DIR]      # then: kubectl apply --server-side -k manifests/base
set -euo pipefail
# shellcheck source=hack/lib/serving-cert.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/serving-cert.sh"
ns="${1:-gpusched-system}"
dir="${2:-./telemetry-pki}"
days="${DAYS:-365}"
read -r -a kubectl <<< "${KUBECTL:-kubectl}"
host="gpusched-telemetry.${ns}.svc"

for cmd in openssl "${kubectl[0]}"; do
  command -v "$cmd" >/dev/null || { echo "telemetry-certs: $cmd is needed and was not found on PATH" >&2; exit 2; }
done
mkdir -p "$dir"
cd "$dir"
serving_cert telemetry "$host" "$days"

"${kubectl[@]}" create namespace "$ns" --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
"${kubectl[@]}" -n "$ns" create secret tls gpusched-telemetry-tls --cert=tls.crt --key=tls.key \
  --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
"${kubectl[@]}" -n "$ns" create configmap gpusched-telemetry-ca --from-file=ca.crt=ca.crt \
  --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
echo "telemetry TLS for ${host}: Secret ${ns}/gpusched-telemetry-tls, ConfigMap ${ns}/gpusched-telemetry-ca (CA in ${dir}; valid ${days} days)"
