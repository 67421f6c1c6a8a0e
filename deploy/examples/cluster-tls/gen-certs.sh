#!/bin/sh
# gen-certs.sh: make the certificates of a dlockd cluster with openssl.
#
#   ./gen-certs.sh [OUTDIR] [NODE...]      defaults: tls n1 n2 n3
#
# OUTDIR/ca.pem, ca-key.pem   one CA (ECDSA P-256, 10 years); keep ca-key.pem off the nodes
# OUTDIR/NODE.pem, NODE-key.pem   a certificate per node, signed by the CA (2 years), with
#                                 CN=NODE and the SANs DNS:NODE and IP:127.0.0.1, usable as
#                                 server and client certificate: dlockd serves it on the API
#                                 port (--tls-cert/--tls-key) and uses it for mutual TLS
#                                 between members (--peer-cert/--peer-key; --peer-ca is ca.pem)
#
# More SANs for a node (its real host name and address) come from the environment:
#   SAN_n1="DNS:n1.example.com,IP:10.0.0.11" ./gen-certs.sh /etc/dlockd/tls n1 n2 n3
# (in the variable's name, a node name's . and - are written _).
# An existing CA in OUTDIR is reused (so a node added later is signed by the same CA);
# an existing node certificate is replaced. Keys are written mode 0600.
set -eu

out=${1:-tls}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- n1 n2 n3

command -v openssl >/dev/null 2>&1 || { echo "gen-certs.sh: openssl not found (Debian: apt-get install openssl)" >&2; exit 1; }
for n in "$@"; do
	case $n in
	*[!A-Za-z0-9._-]* | "") echo "gen-certs.sh: node name \"$n\": want 1-64 bytes of A-Z a-z 0-9 . _ - (dlockd --node-id)" >&2; exit 2 ;;
	esac
done

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$out/ca.pem" ] || [ ! -f "$out/ca-key.pem" ]; then
	openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca-key.pem"
	openssl req -x509 -new -key "$out/ca-key.pem" -sha256 -days 3650 \
		-subj "/O=dlock example/CN=dlock example CA" \
		-addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$out/ca.pem"
	echo "gen-certs.sh: CA $out/ca.pem"
fi

for n in "$@"; do
	san="DNS:$n,IP:127.0.0.1"
	extra=$(eval "printf '%s' \"\${SAN_$(printf '%s' "$n" | tr -c 'A-Za-z0-9_\n' '_'):-}\"")
	[ -n "$extra" ] && san="$san,$extra"
	openssl ecparam -name prime256v1 -genkey -noout -out "$out/$n-key.pem"
	openssl req -new -key "$out/$n-key.pem" -subj "/O=dlock example/CN=$n" -out "$tmp/$n.csr"
	cat >"$tmp/$n.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
	openssl x509 -req -in "$tmp/$n.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" -CAcreateserial \
		-CAserial "$tmp/ca.srl" -sha256 -days 730 -extfile "$tmp/$n.ext" -out "$out/$n.pem" 2>/dev/null
	echo "gen-certs.sh: $out/$n.pem ($san)"
done
chmod 0644 "$out"/*.pem
chmod 0600 "$out"/*-key.pem
