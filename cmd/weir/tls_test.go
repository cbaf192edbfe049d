package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

// writeCerts makes a CA and, signed by it, a certificate for 127.0.0.1
// (server and client use) and a client certificate for "carol", as PEM
// files in dir.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weir test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(name, cn string, serial int64) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".pem", "CERTIFICATE", der)
		write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	leaf("node", "node", 2)
	leaf("carol", "carol", 3)
}

// TestTLS serves the admin API over HTTPS with client certificates and
// peer RPC and lease RPC over mutual TLS, and drives the client with
// --ca, --cert and --key: a client certificate authenticates to the rules
// API like a token.
func TestTLS(t *testing.T) {
	dir := testFiles(t)
	writeCerts(t, dir)
	p := func(name string) string { return filepath.Join(dir, name) }
	tlsYAML := "{cert: " + p("node.pem") + ", key: " + p("node-key.pem") + ", ca: " + p("ca.pem") + "}"
	d := startTestDaemon(t, `
node: {name: secure, region: eu}
gossip: {bind: 127.0.0.1:0, local_timing: true, label: weir-cmd-test-tls}
peer: {rpc: 127.0.0.1:0, tls: `+tlsYAML+`, call_timeout: 10s, decide_timeout: 10s}
rules: {lease: true}
lease:
  voter: {data_dir: `+p("data")+`, raft: 127.0.0.1:0, rpc: 127.0.0.1:0}
  tls: `+tlsYAML+`
http: {listen: 127.0.0.1:0, tls: `+tlsYAML+`}
admin_tokens: {file: `+p("tokens")+`}
`)
	if !d.addrs.HTTPS {
		t.Fatal("ready line does not say https")
	}
	env := map[string]string{"WEIR_ADDR": d.addrs.HTTP}
	if code, out, errOut := cliRun(t, env, "status", "--ca", p("ca.pem")); code != 0 || !strings.Contains(out, "node secure") {
		t.Fatalf("status over https: exit %d: %s%s", code, out, errOut)
	}
	// Plain HTTP to the HTTPS listener fails.
	if code, _, _ := cliRun(t, map[string]string{"WEIR_ADDR": "http://" + d.addrs.HTTP}, "status"); code != 1 {
		t.Fatalf("plain http to https: exit %d", code)
	}
	// No token, no certificate: 401.
	if code, _, errOut := cliRun(t, env, "rules", "get", "--ca", p("ca.pem")); code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("no credentials: exit %d: %s", code, errOut)
	}
	// A client certificate authenticates; the history names its CN. The
	// lease group (mutual TLS on its RPC too) elects itself first: 503
	// until then.
	rule := p("r.json")
	os.WriteFile(rule, []byte(`{"limit": 5, "window": "1s", "key": ["ip"]}`), 0o600)
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _, errOut := cliRun(t, env, "rules", "put", "by-ip", "-f", rule, "--ca", p("ca.pem"), "--cert", p("carol.pem"), "--key", p("carol-key.pem"))
		if code == 0 {
			break
		}
		if !strings.Contains(errOut, "503") || time.Now().After(deadline) {
			t.Fatalf("put with a client certificate: exit %d: %s", code, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, out, errOut := cliRun(t, env, "rules", "history", "--ca", p("ca.pem"), "--cert", p("carol.pem"), "--key", p("carol-key.pem"))
	if code != 0 || !strings.Contains(out, "carol") {
		t.Fatalf("history: exit %d: %s%s", code, out, errOut)
	}

	// A second node joins over gossip, takes the rules from the voter
	// over lease mTLS, and the identity lookup reaches the owner over
	// peer mTLS.
	d2 := startTestDaemon(t, `
node: {name: secure2, region: eu}
gossip: {bind: 127.0.0.1:0, join: [`+d.addrs.Gossip+`], local_timing: true, label: weir-cmd-test-tls}
peer: {rpc: 127.0.0.1:0, tls: `+tlsYAML+`, call_timeout: 10s, decide_timeout: 10s}
rules: {lease: true}
lease:
  voters: [`+d.addrs.LeaseRPC+`]
  tls: `+tlsYAML+`
  check_interval: 200ms
http: {listen: 127.0.0.1:0}
`)
	waitFor(t, 60*time.Second, "two members and the rule on both nodes", func() bool {
		for _, x := range []*daemon{d, d2} {
			if len(ops.Members(x.node)) != 2 || x.node.Status().RulesVersion < 1 {
				return false
			}
		}
		return true
	})
	owners := map[string]bool{}
	for i := range 40 {
		rep, err := ops.LookupIdentity(t.Context(), d2.node, fmt.Sprintf("10.0.0.%d", i), weir.IdentityQuery{})
		if err != nil || len(rep.Rules) != 1 {
			t.Fatalf("lookup: %+v %v", rep, err)
		}
		b := rep.Rules[0].Bucket
		if !b.Known {
			t.Fatalf("the owner's bucket could not be read over peer mTLS: %+v", b)
		}
		owners[b.Node] = true
	}
	if !owners["secure"] || !owners["secure2"] {
		t.Fatalf("40 identities should have both owners, got %v", owners)
	}
	for _, x := range []*daemon{d, d2} {
		for _, c := range ops.Counts(x.node) {
			if c.FailOpen != 0 {
				t.Fatalf("degraded decisions with no fault: %+v", c)
			}
		}
	}
}
