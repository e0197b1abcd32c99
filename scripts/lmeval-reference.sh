#!/usr/bin/env bash
# Produces tests/fixtures/lmeval-wikitext.json: lm-evaluation-harness's `wikitext` task on the
# float32 Hugging Face export of the test model, on a fixed subset of WikiText-2's test pages.
#
#   scripts/lmeval-reference.sh [VENV] [OUT]
#   PPL_LMEVAL_FIRST=N scripts/lmeval-reference.sh [VENV] [OUT]
#
# With PPL_LMEVAL_FIRST=N the subset is the first N pages of the split (pages 0 … N-1), the
# window only the model's own (unless PPL_LMEVAL_MAX_LENGTHS says otherwise) and OUT defaults
# to tests/fixtures/lmeval-wikitext-firstN.json; without it nothing changes. PPL_LMEVAL_CHECKPOINT
# names an already exported checkpoint to use instead of exporting one.
#
# VENV (default /work/lmeval-venv, outside the repository) gets lm-eval, torch and
# transformers from PyPI when it lacks them (the versions the README names). Offline
# otherwise: the data is the local wiki.test.raw (PPL_WIKITEXT_RAW, default
# ../shared/data/wikitext-2-raw/wiki.test.raw).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/work/lmeval-venv}
RAW=${PPL_WIKITEXT_RAW:-../shared/data/wikitext-2-raw/wiki.test.raw}
FIRST=${PPL_LMEVAL_FIRST:-}
if [ -n "$FIRST" ]; then
    [[ "$FIRST" =~ ^[1-9][0-9]*$ ]] || { echo "PPL_LMEVAL_FIRST must be a page count, got '$FIRST'" >&2; exit 2; }
    OUT=${2:-tests/fixtures/lmeval-wikitext-first$FIRST.json}
    DOCS=${PPL_LMEVAL_DOCS:-$(seq -s, 0 $((FIRST - 1)))}
    MAX_LENGTHS=${PPL_LMEVAL_MAX_LENGTHS:-model}
else
    OUT=${2:-tests/fixtures/lmeval-wikitext.json}
    # Pages 0, 12, 14, 28, 29 and 57: the short ones among the first 58 (4,109 SmolLM2 tokens in
    # all), 28 and 29 being the split rule's odd pages (headings made of a formula's lines).
    DOCS=${PPL_LMEVAL_DOCS:-0,12,14,28,29,57}
    # The model's own length (max_position_embeddings, 8192) and a short one that makes page 0
    # (1,397 tokens) three windows.
    MAX_LENGTHS=${PPL_LMEVAL_MAX_LENGTHS:-model,512}
fi

if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -c 'import lm_eval, torch, transformers' 2>/dev/null ||
    "$VENV/bin/pip" install lm-eval==0.4.13 torch==2.15.0 transformers==5.24.0 accelerate

if [ -n "${PPL_LMEVAL_CHECKPOINT:-}" ]; then
    CKPT=$PPL_LMEVAL_CHECKPOINT
else
    PPL=${PPL_BIN:-${CARGO_TARGET_DIR:-target}/release/ppl}
    [ -x "$PPL" ] || cargo build --release
    CKPT=$(mktemp -d)/smollm2-f32
    "$PPL" export "$("$PPL" fetch-model)" --dtype f32 --format safetensors -o "$CKPT"
fi

OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$VENV/bin/python" scripts/lmeval-reference.py --checkpoint "$CKPT" --raw "$RAW" \
    --docs "$DOCS" --max-lengths "$MAX_LENGTHS" --threads 2 --out "$OUT"
[ -n "${PPL_LMEVAL_CHECKPOINT:-}" ] || rm -rf "$(dirname "$CKPT")"
