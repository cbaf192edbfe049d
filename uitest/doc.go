// Package uitest holds the end-to-end test of weir's status page in a
// headless Chromium, driven by chromedp. It is a module of its own so that
// chromedp and its dependencies stay out of the library's go.mod: gateways
// that import weir never see them.
//
//	scripts/install-chromium.sh   # Debian's chromium, when missing
//	cd uitest && go test ./...
//
// Without a browser the test skips with a message saying what to install;
// with CI=true it fails instead.
package uitest
