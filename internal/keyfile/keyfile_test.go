package keyfile

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	raw := bytes.Repeat([]byte{7}, 32)
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
		err  string
	}{
		{"raw", raw, raw, ""},
		{"base64 with a newline", []byte(base64.StdEncoding.EncodeToString(raw[:16]) + "\n"), raw[:16], ""},
		{"base64 of a short key", []byte(base64.StdEncoding.EncodeToString([]byte("short"))), nil, "got 5"},
		{"neither", []byte("not a key!"), nil, "neither"},
	} {
		got, err := Decode(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: Decode = %x, %v; want %x", tc.name, got, err, tc.want)
		}
	}
}

func TestCertPoolRefusesNoPEM(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, []byte("no certificate here"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CertPool(p); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("CertPool of a file with no PEM: %v", err)
	}
}
