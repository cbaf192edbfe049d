package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestGRPCRefusesExpiredCert completes TestGRPCMutualTLS's list (no
// certificate, another CA's, plaintext): a client certificate from the
// right CA that expired is refused too, and the handler never runs.
func TestGRPCRefusesExpiredCert(t *testing.T) {
	checkTransportLeaks(t)
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "peer CA"},
		NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, notAfter time.Time) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "peer"},
			NotBefore: now.Add(-24 * time.Hour), NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	good, expired := leaf(2, now.Add(time.Hour)), leaf(3, now.Add(-time.Hour))

	var calls atomic.Int64
	srv := newGRPC(t, "srv", echo(&calls), func(c *GRPCConfig) {
		c.ServerTLS = &tls.Config{Certificates: []tls.Certificate{good}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	})
	client := func(name string, cert tls.Certificate) *GRPCTransport {
		return newGRPC(t, name, echo(new(atomic.Int64)), func(c *GRPCConfig) {
			c.ClientTLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
		})
	}
	if _, err := client("expired", expired).Exchange(callCtx(t), srv.Addr(), &Message{}); err == nil {
		t.Error("an expired client certificate was served")
	} else {
		t.Logf("expired: %v", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("the handler ran %d times for an expired certificate", calls.Load())
	}
	// The control: the same CA's valid certificate is served.
	if _, err := client("valid", good).Exchange(callCtx(t), srv.Addr(), &Message{}); err != nil {
		t.Fatalf("a valid certificate: %v", err)
	}
}
