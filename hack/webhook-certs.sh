#!/usr/bin/env bash
# Make the DRA-claims admission webhook's TLS material and inject its CA (manifests/overlays/dra):
#   - a CA (kept in DIR, default ./webhook-pki; keep ca.key safe or delete it after use),
#   - a serving certificate for gpusched-webhook.<namespace>.svc signed by it,
#   - Secret <namespace>/gpusched-webhook-tls (tls.crt, tls.key), read by the extender only,
#   - the CA as caBundle of the MutatingWebhookConfiguration gpusched-dra-claims, when it exists
#     (the apiserver verifies the webhook's certificate with it). A later
#     `kubectl apply --server-side -k manifests/overlays/dra` keeps it: the field is this script's.
# Idempotent: an existing CA in DIR is reused and the Secret applied, not created. Needs openssl
# and kubectl (current context, or KUBECTL="kubectl --context X"). cert-manager users issue the
# Secret from a Certificate and let its CA injector fill caBundle instead.
#
#   kubectl apply --server-side -k manifests/overlays/dra && hack/webhook-certs.sh [NAMESPACE] [DIR]
set -euo pipefail
# shellcheck source=hack/lib/serving-cert.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/serving-cert.sh"
ns="${1:-gpusched-system}"
dir="${2:-./webhook-pki}"
days="${DAYS:-365}"
read -r -a kubectl <<< "${KUBECTL:-kubectl}"
host="gpusched-webhook.${ns}.svc"
config="gpusched-dra-claims"

for cmd in openssl base64 "${kubectl[0]}"; do
  command -v "$cmd" >/dev/null || { echo "webhook-certs: $cmd is needed and was not found on PATH" >&2; exit 2; }
done
mkdir -p "$dir"
cd "$dir"
serving_cert webhook "$host" "$days"

"${kubectl[@]}" create namespace "$ns" --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
"${kubectl[@]}" -n "$ns" create secret tls gpusched-webhook-tls --cert=tls.crt --key=tls.key \
  --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
if "${kubectl[@]}" get mutatingwebhookconfiguration "$config" >/dev/null 2>&1; then
  bundle="$(base64 < ca.crt | tr -d '\n')"
  "${kubectl[@]}" patch mutatingwebhookconfiguration "$config" --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/webhooks/0/clientConfig/caBundle\", \"value\": \"${bundle}\"}]"
  echo "webhook TLS for ${host}: Secret ${ns}/gpusched-webhook-tls, caBundle of ${config} (CA in ${dir}; valid ${days} days)"
else
  echo "webhook TLS for ${host}: Secret ${ns}/gpusched-webhook-tls (CA in ${dir}); MutatingWebhookConfiguration" \
       "${config} not found: apply manifests/overlays/dra and rerun this script to inject its caBundle" >&2
  exit 1
fi
