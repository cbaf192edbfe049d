package envoyconf

import (
	"errors"
	"os"
	"testing"

	"github.com/weir-dev/weir/quota"
)

// FuzzParse: Parse never panics, returns a domain or well-formed errors,
// and whatever parses compiles or fails with errors (never a panic); every
// compiled config answers Match.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("testdata/ratelimit.yaml"); err == nil {
		f.Add(data)
	}
	for _, s := range []string{
		"", "domain: d\n", "domain: d\ndescriptors: []\n", "~", "[]",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit: {unlimited: true}\n",
		"domain: d\ndescriptors:\n  - &a {key: k, descriptors: [*a]}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967295, name: n, replaces: [{name: m}]}\n",
		"domain: d\ndescriptors:\n  - {key: \"\\x01/=%\", value: \"*\", detailed_metric: true, shadow_mode: true}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("fuzz.yaml", data)
		if err != nil {
			if d != nil {
				t.Fatal("a domain and an error")
			}
			var qe *quota.Error
			if !errors.As(err, &qe) || qe.File != "fuzz.yaml" || qe.Msg == "" {
				t.Fatalf("malformed error %#v", err)
			}
			return
		}
		c, err := Compile(Options{}, d)
		if err != nil {
			return
		}
		if _, err := quota.NewSet(c.Rules(), 1); err != nil {
			t.Fatalf("compiled rules do not make a set: %v", err)
		}
		for _, ds := range d.Descriptors {
			c.Match(d.Name, []Entry{{ds.Key, ds.Value}, {"x", "y"}})
			c.Match(d.Name, []Entry{{ds.Key, ds.Value}})
		}
	})
}
