#!/usr/bin/env bash
# Times the README's two install commands on a fresh clone in a fresh venv
# (docs/building.md): the first builds the C++ extension; the second must
# rebuild nothing ("ninja: no work to do"). Needs the package registry; about
# 3 minutes on 2 cores with pip's cache warm.
#   bash tools/time_install.sh [REPO]   # REPO: what to clone (default: this checkout)
set -euo pipefail
REPO=${1:-$(cd "$(dirname "$0")/.." && pwd)}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
git clone -q "$REPO" "$DIR/c"
python3 -m venv "$DIR/v"
cd "$DIR/c"
for extra in examples test; do
  start=$(date +%s)
  "$DIR/v/bin/pip" install -v -e ".[$extra]" >"$DIR/$extra.log" 2>&1
  objects=$(grep -cE '^\s*\[[0-9]+/[0-9]+\] Building' "$DIR/$extra.log" || true)
  echo "pip install -e '.[$extra]': $(( $(date +%s) - start )) s, $objects objects compiled$(grep -q 'ninja: no work to do' "$DIR/$extra.log" && echo ', ninja: no work to do')"
done
