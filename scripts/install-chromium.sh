#!/usr/bin/env bash
# Installs the headless browser that the page's browser test (uitest/) drives:
# Debian's chromium package. It does nothing when a chromium is already on the
# PATH. As root it installs the package; otherwise it prints what to install
# and exits 0, so that the browser test then skips (or, with CI=true, fails
# with a clear message).
#
#   scripts/install-chromium.sh
set -euo pipefail

for b in chromium chromium-browser google-chrome headless-shell; do
	if command -v "$b" >/dev/null 2>&1; then
		echo "browser present: $(command -v "$b")"
		exit 0
	fi
done

if [ "$(id -u)" -ne 0 ]; then
	echo "no chromium found and not root: install the Debian package chromium (apt-get install chromium) to run the browser test in uitest/" >&2
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
echo "installed: $(command -v chromium) ($(chromium --version 2>/dev/null || echo 'version unknown'))"
