# shellcheck shell=bash
# Sourced by hack/telemetry-certs.sh and hack/webhook-certs.sh: what both do the same way — check
# their tools, make one CA and a serving certificate signed by it, apply the objects they make.
#
# Sourcing it sets what both take the same way: ns (their first argument, default gpusched-system),
# days ($DAYS, default 365) and kubectl (an array: $KUBECTL, default kubectl).
#
#   need_tools SCRIPT CMD...            # exit 2 naming the first CMD not on PATH
#   apply_generated KUBECTL-ARGS...     # `kubectl ARGS --dry-run=client -o yaml | kubectl apply -f -`:
#                                       # create or update, so a rerun is harmless; kubectl is the
#                                       # caller's array (KUBECTL="kubectl --context X")
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
# shellcheck disable=SC2034  # read by the sourcing script
ns="${1:-gpusched-system}"
# shellcheck disable=SC2034
days="${DAYS:-365}"
read -r -a kubectl <<< "${KUBECTL:-kubectl}"

need_tools() {
  local who="$1" cmd
  shift
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null || { echo "$who: $cmd is needed and was not found on PATH" >&2; exit 2; }
  done
}

apply_generated() {
  "${kubectl[@]}" "$@" --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
}
