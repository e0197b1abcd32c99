#!/usr/bin/env bash
# lm-eval's `wikitext` task against `ppl eval --task wikitext`, time and metrics, on the first N
# pages of WikiText-2's test split. ROUNDS rounds (default 2), each running one after the
# other:
#   1. lm-eval (scripts/lmeval-reference.py: its HF model, torch CPU, float32, batch 1, the
#      model's own window) on the float32 safetensors export of the test model;
#   2. ppl eval --task wikitext --chunks N --precision f32 on the same export;
#   3. ppl eval --task wikitext --chunks N (native) on the GGUF;
# each a whole process under GNU time (/usr/bin/time -v), PPL_THREADS threads (default 2).
# Writes DIR/table.md (also printed) with wall time, tokens/s, peak RSS and the metrics of
# every run, and the medians and ratios.
#
#   scripts/lmeval-speed.sh N [ROUNDS]
#
# With --task wikitext, --chunks N scores the first N pages of the split (src/task/mod.rs,
# prepare_documents), the same pages lm-eval gets with --docs 0,…,N-1.
#
# Environment: PPL_LMEVAL_VENV (default /work/lmeval-venv; made here when absent, as
# scripts/lmeval-reference.sh makes it), PPL_WIKITEXT_RAW (default
# ../shared/data/wikitext-2-raw/wiki.test.raw), PPL_BIN (default target/release/ppl, built when
# absent), PPL_SPEED_DIR (default target/lmeval-speed-firstN; must not hold an earlier run's
# files), PPL_SPEED_FIXTURE (a path: round 1's lm-eval output is copied there, e.g.
# tests/fixtures/lmeval-wikitext-firstN.json: the file `PPL_LMEVAL_FIRST=N
# scripts/lmeval-reference.sh` writes), PPL_SPLIT_TOKENS (default 290683, the whole split's
# tokens, for the extrapolation).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:?usage: scripts/lmeval-speed.sh N [ROUNDS]}
ROUNDS=${2:-2}
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "N must be a page count, got '$N'" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a count, got '$ROUNDS'" >&2; exit 2; }
VENV=${PPL_LMEVAL_VENV:-/work/lmeval-venv}
RAW=${PPL_WIKITEXT_RAW:-../shared/data/wikitext-2-raw/wiki.test.raw}
THREADS=${PPL_THREADS:-2}
DIR=${PPL_SPEED_DIR:-${CARGO_TARGET_DIR:-target}/lmeval-speed-first$N}
SPLIT_TOKENS=${PPL_SPLIT_TOKENS:-290683}
FIXTURE=${PPL_SPEED_FIXTURE:-}
TIME=/usr/bin/time

"$TIME" -V >/dev/null 2>&1 || { echo "GNU time is missing: apt-get install time" >&2; exit 2; }
[ -f "$RAW" ] || { echo "$RAW: no such file (set PPL_WIKITEXT_RAW)" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -c 'import lm_eval, torch, transformers' 2>/dev/null ||
    "$VENV/bin/pip" install lm-eval==0.4.13 torch==2.15.0 transformers==5.24.0 accelerate
PPL=${PPL_BIN:-${CARGO_TARGET_DIR:-target}/release/ppl}
[ -x "$PPL" ] || cargo build --release

mkdir -p "$DIR"
if compgen -G "$DIR/r*" >/dev/null; then
    echo "$DIR holds an earlier run's files; remove them or set PPL_SPEED_DIR" >&2
    exit 2
fi
GGUF=$("$PPL" fetch-model)
CKPT=$DIR/smollm2-f32
[ -f "$CKPT/config.json" ] ||
    "$PPL" export "$GGUF" --dtype f32 --format safetensors -o "$CKPT"
DOCS=$(seq -s, 0 $((N - 1)))

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname), $(nproc) CPUs"
    echo "ppl: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
    echo "venv: $("$VENV/bin/python" -c 'import importlib.metadata as m; print(", ".join(p + " " + m.version(p) for p in ("lm_eval", "torch", "transformers")))')"
    echo "pages: first $N ($DOCS), rounds: $ROUNDS, threads: $THREADS"
} >"$DIR/about.txt"
cat "$DIR/about.txt"

# run NAME CMD...: CMD under GNU time, with the load average just before it.
run() {
    local name=$1
    shift
    cut -d' ' -f1-3 /proc/loadavg >"$DIR/$name.load"
    echo "[$(date +%T)] $name (load $(cat "$DIR/$name.load"))"
    if ! "$TIME" -v -o "$DIR/$name.time" "$@" >"$DIR/$name.log" 2>&1; then
        echo "$name failed; see $DIR/$name.log and $DIR/$name.time" >&2
        tail -n 20 "$DIR/$name.log" >&2
        exit 1
    fi
}

for r in $(seq 1 "$ROUNDS"); do
    run "r$r-lmeval" env OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" \
        HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
        "$VENV/bin/python" scripts/lmeval-reference.py --checkpoint "$CKPT" --raw "$RAW" \
        --docs "$DOCS" --max-lengths model --threads "$THREADS" --out "$DIR/r$r-lmeval.json"
    run "r$r-f32" "$PPL" eval --model "$CKPT" --data "$RAW" --task wikitext --chunks "$N" \
        --precision f32 --threads "$THREADS" --progress none \
        --run-dir "$DIR/r$r-f32.run" --output "$DIR/r$r-f32.json"
    run "r$r-native" "$PPL" eval --model "$GGUF" --data "$RAW" --task wikitext --chunks "$N" \
        --threads "$THREADS" --progress none \
        --run-dir "$DIR/r$r-native.run" --output "$DIR/r$r-native.json"
done

if [ -n "$FIXTURE" ]; then
    cp "$DIR/r1-lmeval.json" "$FIXTURE"
    echo "wrote $FIXTURE"
fi

python3 - "$DIR" "$N" "$ROUNDS" "$SPLIT_TOKENS" <<'EOF' | tee "$DIR/table.md"
import json, re, statistics, sys
from pathlib import Path

d, n, rounds, split_tokens = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
TOOLS = [
    ("lmeval", "lm-eval (torch CPU, float32)"),
    ("f32", "ppl `--precision f32`"),
    ("native", "ppl `native` (GGUF Q4_1)"),
]
METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def gnu_time(path):
    text = path.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text).group(1)
    secs = 0.0
    for part in wall.split(":"):
        secs = secs * 60 + float(part)
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", text).group(1)
    return secs, kib / 1024, int(cpu)


runs = {}
for r in range(1, rounds + 1):
    for key, _ in TOOLS:
        wall, rss, cpu = gnu_time(d / f"r{r}-{key}.time")
        res = json.loads((d / f"r{r}-{key}.json").read_text())
        if key == "lmeval":
            run = next(x for x in res["runs"] if x["max_length_arg"] == "model")
            tokens = sum(res["tokens"].values())
            inner = run["seconds"]
            metrics = {m: run[m] for m in METRICS}
            docs = len(run["documents"])
        else:
            tokens = res["tokens"]
            inner = res["timings"]["eval_s"]
            metrics = {m: res[m] for m in METRICS}
            docs = res["data"]["documents"]
        load = (d / f"r{r}-{key}.load").read_text().split()[0]
        runs[(r, key)] = dict(wall=wall, rss=rss, cpu=cpu, tokens=tokens, inner=inner,
                              metrics=metrics, docs=docs, load=load)

lm_tokens = runs[(1, "lmeval")]["tokens"]
problems = [f"round {r} {k}: {v['tokens']} tokens, {v['docs']} pages (lm-eval: {lm_tokens}, {n})"
            for (r, k), v in runs.items() if v["tokens"] != lm_tokens or v["docs"] != n]

print(f"The first {n} page(s) of the WikiText-2 test split, {lm_tokens:,} tokens; {rounds} rounds, "
      "each lm-eval, ppl f32, ppl native one after the other; whole processes under GNU time.\n")
print("| round | tool | load before | wall s | in-tool s | tokens/s | CPU % | peak RSS MiB | "
      + " | ".join(f"`{m}`" for m in METRICS) + " |")
print("|---" * (8 + len(METRICS)) + "|")
for r in range(1, rounds + 1):
    for key, label in TOOLS:
        v = runs[(r, key)]
        print(f"| {r} | {label} | {v['load']} | {v['wall']:.1f} | {v['inner']:.1f} | "
              f"{v['tokens'] / v['wall']:.1f} | {v['cpu']} | {v['rss']:.0f} | "
              + " | ".join(f"{v['metrics'][m]:.8g}" for m in METRICS) + " |")
print("\nin-tool s: lm-eval's `simple_evaluate` (model load and task set-up included), "
      "ppl's `timings.eval_s`.\n")

print("| tool | wall s (median) | tokens/s | peak RSS MiB (max) | lm-eval wall / this (median of rounds) "
      f"| full split ({split_tokens:,} tokens), extrapolated from tokens/s |")
print("|---|---|---|---|---|---|")
for key, label in TOOLS:
    walls = [runs[(r, key)]["wall"] for r in range(1, rounds + 1)]
    ratios = [runs[(r, "lmeval")]["wall"] / runs[(r, key)]["wall"] for r in range(1, rounds + 1)]
    wall = statistics.median(walls)
    rate = lm_tokens / wall
    rss = max(runs[(r, key)]["rss"] for r in range(1, rounds + 1))
    print(f"| {label} | {wall:.1f} | {rate:.1f} | {rss:.0f} | {statistics.median(ratios):.2f}× "
          f"| {split_tokens / rate / 60:.1f} min (extrapolation) |")

print("\n| metric | lm-eval | ppl f32 | relative | ppl native | relative |")
print("|---|---|---|---|---|---|")
worst = 0.0
for m in METRICS:
    lm = runs[(1, "lmeval")]["metrics"][m]
    f32 = runs[(1, "f32")]["metrics"][m]
    nat = runs[(1, "native")]["metrics"][m]
    worst = max(worst, abs(f32 / lm - 1))
    print(f"| `{m}` | {lm:.8g} | {f32:.8g} | {f32 / lm - 1:+.2e} | {nat:.8g} | {nat / lm - 1:+.2e} |")
same = all(runs[(r, k)]["metrics"] == runs[(1, k)]["metrics"] for (r, k) in runs)
print(f"\nf32 against lm-eval: worst relative difference {worst:.2e} "
      f"({'within' if worst < 1e-4 else 'NOT within'} 1e-4); every round gave "
      f"{'the same' if same else 'DIFFERENT'} metrics as round 1.")
for p in problems:
    print(f"\nWARNING: {p}")
EOF
