#!/usr/bin/env bash
# Make a throwaway CA, one certificate for every heraldps process of the compose file, and the
# two role tokens, in the directory given (default: this script's directory):
#   bash deploy/tls/make-certs.sh [DIR]
# ca.crt/ca.key      the CA every process trusts (keep ca.key off the cluster)
# heraldps.crt/.key  a certificate for the names heraldps (what the Kubernetes component
#                    checks), ps-0, ps-1, scheduler, worker-0, worker-1,
#                    feed, localhost and 127.0.0.1, usable as server and as client certificate
# admin.token        the operator's and the scheduler's token (Save, Load, Commit, ...)
# worker.token       the workers' token (training RPCs only)
# One certificate for all is the simple set-up; give each process its own in production
# (docs/security.md). The private keys and tokens are written mode 0600 (owner only; heraldps
# warns about a secret file other users can read). The compose containers run as uid 10001:
# HERALDPS_CERT_OWNER=10001 (as root) hands the secret files to that user.
set -euo pipefail
out=${1:-$(dirname "$0")}
mkdir -p "$out"
cd "$out"
umask 077  # every file private from its first byte; the certificates are opened up below
names=${HERALDPS_CERT_NAMES:-DNS:heraldps,DNS:ps-0,DNS:ps-1,DNS:scheduler,DNS:worker-0,DNS:worker-1,DNS:feed,DNS:localhost,IP:127.0.0.1}
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -keyout ca.key -out ca.crt -days 365 -subj /CN=heraldps-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
  2>/dev/null
openssl req -new "${curve[@]}" -keyout heraldps.key -out heraldps.csr -subj /CN=heraldps \
  2>/dev/null
printf '%s\n' "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature,keyEncipherment" \
  "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=${names}" >heraldps.ext
openssl x509 -req -in heraldps.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
  -extfile heraldps.ext -out heraldps.crt 2>/dev/null
rm -f heraldps.csr heraldps.ext ca.srl
openssl rand -hex 32 >admin.token
openssl rand -hex 32 >worker.token
chmod 644 ca.crt heraldps.crt
chmod 600 ca.key heraldps.key admin.token worker.token
if [[ -n "${HERALDPS_CERT_OWNER:-}" ]]; then
  chown "$HERALDPS_CERT_OWNER" heraldps.key admin.token worker.token
fi
echo "wrote ca.crt heraldps.crt heraldps.key admin.token worker.token to $(pwd)"
