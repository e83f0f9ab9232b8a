#!/bin/sh
# Test-only TLS material for tests/test_upstream.py: a CA and a server certificate
# for 127.0.0.1 and localhost, valid for 100 years.  The keys are public: never
# trust this CA anywhere.  Run from this directory to make them again.
set -e
cat > ca.ext <<'X'
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
X
cat > server.ext <<'X'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
X
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -new -key ca.key -subj "/CN=ragproxy test CA" -out ca.csr
openssl x509 -req -in ca.csr -signkey ca.key -days 36500 -sha256 -extfile ca.ext -out ca.pem
openssl ecparam -name prime256v1 -genkey -noout -out server.key
openssl req -new -key server.key -subj "/CN=127.0.0.1" -out server.csr
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 36500 -sha256 \
    -extfile server.ext -out server.pem
rm -f ca.csr server.csr ca.ext server.ext ca.key
