#!/usr/bin/env bash
# Make the DRA-claims admission webhook's TLS material and inject its CA (manifests/overlays/dra):
#   - a CA (kept in DIR, default ./webhook-pki; keep ca.key safe or delete it after use),
#   - a serving certificate for gpusched-webhook.<namespace>.svc signed by it,
#   - the apiserver's client certificate for the webhook, signed by the same CA, in
#     webhook-kubeconfig.yaml (a user named gpusched-webhook.<namespace>.svc:443, certificate
#     embedded) and admission-config.yaml naming it: install both on every control-plane host and
#     start kube-apiserver with --admission-control-config-file=<its path> (merge the plugins into
#     an admission configuration you already have; the kubeconfig is expected at
#     $ADMISSION_DIR/webhook-kubeconfig.yaml, default /etc/kubernetes/gpusched). The extender
#     refuses every caller without it (--webhook-client-ca), the apiserver included,
#   - Secret <namespace>/gpusched-webhook-tls (tls.crt, tls.key, and ca.crt: the CA the apiserver's
#     client certificate must chain to), read by the extender only,
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
dir="${2:-./webhook-pki}"
admission_dir="${ADMISSION_DIR:-/etc/kubernetes/gpusched}"
host="gpusched-webhook.${ns}.svc"
config="gpusched-dra-claims"

need_tools webhook-certs openssl base64 "${kubectl[0]}"
mkdir -p "$dir"
cd "$dir"
serving_cert webhook "$host" "$days"

# The apiserver's client certificate for this webhook (the extender's --webhook-client-ca is ca.crt).
openssl req -newkey rsa:2048 -nodes -keyout apiserver-client.key -out apiserver-client.csr \
  -subj "/CN=kube-apiserver-webhook-client" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > apiserver-client.ext
openssl x509 -req -in apiserver-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver-client.crt \
  -days "$days" -extfile apiserver-client.ext 2>/dev/null
chmod 600 apiserver-client.key
cat > webhook-kubeconfig.yaml <<EOF
# kube-apiserver's credentials for gpusched's DRA-claims webhook (hack/webhook-certs.sh).
apiVersion: v1
kind: Config
users:
- name: ${host}:443
  user:
    client-certificate-data: $(base64 < apiserver-client.crt | tr -d '\n')
    client-key-data: $(base64 < apiserver-client.key | tr -d '\n')
EOF
chmod 600 webhook-kubeconfig.yaml
cat > admission-config.yaml <<EOF
# kube-apiserver --admission-control-config-file: present webhook-kubeconfig.yaml's client
# certificate to the webhooks it names (hack/webhook-certs.sh).
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: ${admission_dir}/webhook-kubeconfig.yaml
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: ${admission_dir}/webhook-kubeconfig.yaml
EOF

apply_generated create namespace "$ns" >/dev/null
apply_generated -n "$ns" create secret generic gpusched-webhook-tls --type=kubernetes.io/tls \
  --from-file=tls.crt --from-file=tls.key --from-file=ca.crt
echo "kube-apiserver: copy ${dir}/admission-config.yaml and webhook-kubeconfig.yaml to ${admission_dir}/ on every" \
     "control-plane host and start it with --admission-control-config-file=${admission_dir}/admission-config.yaml"
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
