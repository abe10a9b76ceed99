#!/usr/bin/env bash
# Rebuild vtinfer._C in place for development, safely when several people
# share one working tree: one build at a time (flock), a private build
# folder, and an atomic rename of the finished .so so that processes that
# already loaded the old one keep running.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>/tmp/vtinfer-dev-build.lock
flock 9
tmp=$(mktemp -d /tmp/vtbuild.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
python3 setup.py -q build_ext --build-lib "$tmp/lib" --build-temp "$tmp/tmp" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
grep -E 'warning|error' "$tmp/log" || true
so=$(find "$tmp/lib" -name '_C*.so' | head -1)
cp "$so" "vtinfer/.$(basename "$so").new"
mv -f "vtinfer/.$(basename "$so").new" "vtinfer/$(basename "$so")"
echo "built vtinfer/$(basename "$so")"
