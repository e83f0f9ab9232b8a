#!/bin/sh
# Test-only TLS material for the https tests: a CA, a server certificate for
# 127.0.0.1 and localhost, and a client certificate (for gateways that ask for
# one), valid for 100 years.  The keys are public: never trust this CA anywhere.
# Run from this directory to make them all again (the CA key is not kept).
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
cat > client.ext <<'X'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
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
openssl ecparam -name prime256v1 -genkey -noout -out client.key
openssl req -new -key client.key -subj "/CN=ragproxy test client" -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days 36500 -sha256 \
    -extfile client.ext -out client.pem
rm -f ca.csr server.csr client.csr ca.ext server.ext client.ext ca.key
