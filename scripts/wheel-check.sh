#!/usr/bin/env bash
# Builds the Python wheel `ppl-eval` (maturin; the `ppl` binary inside, as ruff and uv ship
# theirs), installs it into a fresh virtualenv and uses it from there: `ppl --version`, a
# two-window evaluation, and `ppl_eval.evaluate(...)` returning results.json as a dict (and
# raising ppl's own message on a bad input).
#
#   scripts/wheel-check.sh [MODEL.gguf]     (default: `ppl fetch-model`)
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/wikitext-2-raw/wiki.test.raw
[ -f "$data" ] || { echo "wheel-check: $data is missing (the shared/ folder beside the repository)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/build"
"$work/build/bin/pip" install --quiet "maturin>=1.5,<2"
"$work/build/bin/maturin" build --release --locked --out "$work/wheels"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$work"/wheels/ppl_eval-*.whl
ls -la "$work"/wheels/
"$work/venv/bin/ppl" --version
model=${1:-$("$work/venv/bin/ppl" fetch-model)}
"$work/venv/bin/ppl" eval --model "$model" --data "$data" --ctx 128 --chunks 2 --progress none
"$work/venv/bin/python" - "$model" "$data" <<'PY'
import sys
from ppl_eval import PplError, evaluate

model, data = sys.argv[1], sys.argv[2]
r = evaluate(model, data, ctx=128, chunks=2, batch_size=2)
assert isinstance(r, dict) and r["ppl"] > 1 and r["tokens"] == 2 * 64 - 2, r.get("tokens")
assert r["config"]["ctx"] == 128 and len(r["windows"]) == 2
print(f"evaluate(): PPL {r['ppl']:.4f} over {r['tokens']} tokens")
try:
    evaluate(model, data, ctx=1)
except PplError as e:
    assert "--ctx" in str(e), e
    print(f"evaluate(ctx=1) raised PplError: {str(e).splitlines()[0]}")
else:
    raise SystemExit("evaluate(ctx=1) should have failed")
PY
echo "wheel-check: passed"
