#!/usr/bin/env bash
# Opens a ppl HTML report in headless Chromium (Debian's package, installed if missing),
# fails if the page logs any console error, and saves a screenshot.
# Usage: scripts/report-screenshot.sh report.html [screenshot.png]
set -euo pipefail
report=$(realpath "$1")
png=${2:-${report%.html}.png}
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
profile=$(mktemp -d)
log=$(mktemp)
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --user-data-dir="$profile" --enable-logging=stderr --v=0 --hide-scrollbars
  --window-size=1100,4200)
chromium "${flags[@]}" --screenshot="$png" "file://$report" 2>"$log" >/dev/null || true
# Console messages from the page are logged as CONSOLE(...) lines.
if grep -E "CONSOLE.*(Uncaught|Error|error)" "$log"; then
  echo "console errors in $report" >&2
  exit 1
fi
test -s "$png" || { echo "no screenshot written" >&2; cat "$log" >&2; exit 1; }
echo "no console errors; screenshot: $png"
rm -rf "$profile" "$log"
