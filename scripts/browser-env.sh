#!/usr/bin/env bash
# Chromium for the chat page's browser test (server/tests/web_page.rs drives it with
# Playwright from vendor/pyref). Playwright's own browser download needs a network this
# project does not have, so the test uses the system's Chromium: Debian's package,
# installed here when missing (root and apt-get), or whatever CHROMIUM points at.
# Idempotent: returns at once when a Chromium is there.
set -euo pipefail
if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then exit 0; fi
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then exit 0; fi
done
if [ -x "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome" ]; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
  chromium --version
  exit 0
fi
echo "browser-env: no Chromium found; install Chromium or Chrome (Debian: apt-get install chromium), or set CHROMIUM" >&2
exit 1
