# shellcheck shell=bash
# Sourced by hack/telemetry-certs.sh and hack/webhook-certs.sh: one CA and a serving certificate
# signed by it, the same way for both ports.
#
#   serving_cert NAME HOST DAYS [OUT]   # in the current folder: ca.key/ca.crt (made once, then
#                                       # reused so clients keep trusting it), OUT.key/OUT.crt
#                                       # (default tls.*) for HOST (and HOST.cluster.local), CN of
#                                       # the CA "gpusched-NAME-ca" when this call makes it
serving_cert() {
  local name="$1" host="$2" days="$3" out="${4:-tls}"
  if [[ ! -s ca.key || ! -s ca.crt ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days "$days" \
      -subj "/CN=gpusched-${name}-ca" 2>/dev/null
    chmod 600 ca.key
  fi
  openssl req -newkey rsa:2048 -nodes -keyout "$out.key" -out "$out.csr" -subj "/CN=${host}" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' "$host" "$host" > "$out.ext"
  openssl x509 -req -in "$out.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$out.crt" -days "$days" \
    -extfile "$out.ext" 2>/dev/null
  chmod 600 "$out.key"
  openssl verify -CAfile ca.crt -verify_hostname "$host" "$out.crt" >/dev/null
}
