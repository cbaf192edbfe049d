// Package keyfile reads the files a node's peer traffic is secured with, as
// weir's daemon and its Caddy module both take them: gossip keys and PEM
// certificate pools.
package keyfile

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
)

// ValidLen reports whether n bytes make a gossip key (AES-128, -192 or
// -256).
func ValidLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// Decode returns the gossip key a key file's contents b hold: b itself
// when it is a raw key of 16, 24 or 32 bytes, else b's base64 text
// decoded, which must be a key of those sizes too.
func Decode(b []byte) ([]byte, error) {
	if ValidLen(len(b)) {
		return b, nil
	}
	k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil {
		return nil, fmt.Errorf("neither a raw key of 16, 24 or 32 bytes nor base64")
	}
	if !ValidLen(len(k)) {
		return nil, fmt.Errorf("a gossip key is 16, 24 or 32 bytes, got %d", len(k))
	}
	return k, nil
}

// CertPool reads the PEM certificates of the file at path into a pool; a
// file with none is an error.
func CertPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
