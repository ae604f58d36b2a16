#!/usr/bin/env bash
# Make the scheduler pod's TLS material for a kustomize install (Helm users may set
# telemetry.tls.generate instead; cert-manager users issue the Secrets themselves):
#   - a CA (kept in DIR, default ./telemetry-pki; keep ca.key safe or delete it after use),
#   - a serving certificate for gpusched-telemetry.<namespace>.svc signed by it,
#   - Secret <namespace>/gpusched-telemetry-tls (tls.crt, tls.key), read by the extender only,
#   - ConfigMap <namespace>/gpusched-telemetry-ca (ca.crt), read by the node agents,
#   - the metrics proxy's serving certificate for gpusched-extender-metrics.<namespace>.svc (the
#     Service of manifests/observability), signed by the same CA, in Secret
#     <namespace>/gpusched-metrics-tls (tls.crt, tls.key, and ca.crt: the CA the ServiceMonitor
#     gives Prometheus to verify the proxy with), mounted by the metrics proxy only.
# Idempotent: an existing CA in DIR is reused (so agents keep trusting it) and the objects are
# applied, not created. Needs openssl and kubectl (current context, or KUBECTL="kubectl --context X").
#
#   hack/telemetry-certs.sh [NAMESPACE] [DIR]      # then: kubectl apply --server-side -k manifests/base
set -euo pipefail
# shellcheck source=hack/lib/serving-cert.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/serving-cert.sh"
dir="${2:-./telemetry-pki}"
host="gpusched-telemetry.${ns}.svc"
metrics_host="gpusched-extender-metrics.${ns}.svc"

need_tools telemetry-certs openssl "${kubectl[0]}"
mkdir -p "$dir"
cd "$dir"
serving_cert telemetry "$host" "$days"
serving_cert telemetry "$metrics_host" "$days" metrics-tls

apply_generated create namespace "$ns" >/dev/null
apply_generated -n "$ns" create secret tls gpusched-telemetry-tls --cert=tls.crt --key=tls.key
apply_generated -n "$ns" create configmap gpusched-telemetry-ca --from-file=ca.crt=ca.crt
apply_generated -n "$ns" create secret generic gpusched-metrics-tls --type=kubernetes.io/tls \
  --from-file=tls.crt=metrics-tls.crt --from-file=tls.key=metrics-tls.key --from-file=ca.crt=ca.crt
echo "telemetry TLS for ${host}: Secret ${ns}/gpusched-telemetry-tls, ConfigMap ${ns}/gpusched-telemetry-ca (CA in ${dir}; valid ${days} days)"
echo "metrics proxy TLS for ${metrics_host}: Secret ${ns}/gpusched-metrics-tls (same CA)"
