#!/usr/bin/env python3
"""Reference perplexity of the GPTQ paper protocol, computed by PyTorch/transformers in float32.

The protocol is the one quantization papers (GPTQ and its successors) report for WikiText-2
and C4:

- WikiText-2: the rows of the `wikitext-2-raw-v1` test split are joined with "\\n\\n" and
  tokenized once; C4: the `text` of the first 1100 documents is joined with " ", tokenized
  once and truncated to the first 256 * ctx tokens.
- The token ids are cut into nsamples = n_tokens // ctx windows of ctx tokens (the remainder
  is dropped). Each window is scored on its own: the logits at positions 0..ctx-2 predict the
  tokens at 1..ctx-1, loss_i = the mean cross-entropy over those ctx-1 tokens, and
  nll_i = loss_i * ctx (float32). PPL = exp(sum(nll_i) / (nsamples * ctx)).

WikiText-2 input is either the dataset's parquet file (`--parquet`, column `text`) or the raw
`wiki.test.raw` (`--raw`), whose lines are laid out as the dataset's rows: every non-blank line
is a row with its trailing "\\n"; every heading line has an empty row before and after it, and
every article heading except the first has one more empty row before it. A heading is a line
whose strip() starts with "= " and ends with " =", except two formula lines of the text.
The layout is checked: 4358 rows whose concatenation is the raw file.

Besides the protocol's own figures the output holds, for every window, the sum of the NLL of
its ctx-1 predicted tokens computed in float64 (log_softmax of the float32 logits cast to
float64), so that an implementation accumulating in f64 can be compared at about 1e-9.

Usage (a Hugging Face checkpoint directory, e.g. from `ppl export MODEL --dtype f32
--format safetensors -o DIR`; needs torch, transformers, safetensors, and pyarrow for --parquet):

    python3 scripts/gptq-reference.py --checkpoint DIR --raw wiki.test.raw --ctx 2048 --out wt2.json
    python3 scripts/gptq-reference.py --checkpoint DIR --c4-json c4.json.gz --ctx 2048 --out c4.json
"""

import argparse
import gzip
import json
import math
import platform
import shlex
import sys
import time

WIKITEXT2_TEST_ROWS = 4358

# Lines of wiki.test.raw shaped like headings that the dataset holds as ordinary text rows.
NOT_HEADINGS = {
    " = 1 rad / s and a nominal impedance k = ",
    " = 1 henry and capacitance C = ",
}

C4_DOCUMENTS = 1100
C4_WINDOWS = 256


def is_heading(line):
    stripped = line.strip()
    return line not in NOT_HEADINGS and stripped.startswith("= ") and stripped.endswith(" =")


def wikitext_rows_from_raw(path):
    """The `text` rows of the wikitext-2-raw-v1 test split, rebuilt from wiki.test.raw."""
    with open(path, encoding="utf-8", newline="") as f:
        raw = f.read()
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    seen_article = False
    for line in lines:
        if not line.strip():
            raise SystemExit(f"{path}: unexpected blank line; expected the raw file without blank lines")
        if is_heading(line):
            if not line.strip().startswith("= ="):
                if seen_article:
                    rows.append("")
                seen_article = True
            rows.extend(["", line + "\n", ""])
        else:
            rows.append(line + "\n")
    if len(rows) != WIKITEXT2_TEST_ROWS:
        raise SystemExit(f"{path}: laid out {len(rows)} rows, expected {WIKITEXT2_TEST_ROWS}")
    if "".join(rows) != raw:
        raise SystemExit(f"{path}: the rows do not concatenate back to the raw file")
    return rows


def wikitext_rows_from_parquet(path):
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["text"]).column("text").to_pylist()


def c4_documents(path, count):
    """The `text` of the first `count` documents of a JSON Lines (optionally gzipped) file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        content = f.read()
    if content.lstrip().startswith("["):
        records = json.loads(content)
    else:
        records = [json.loads(line) for line in content.splitlines() if line.strip()]
    return [record["text"] for record in records[:count]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="Hugging Face checkpoint directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--raw", help="WikiText-2 wiki.test.raw")
    source.add_argument("--parquet", help="WikiText-2 test split parquet file (column `text`)")
    source.add_argument("--c4-json", help="C4 documents, JSON Lines (.json/.jsonl, optionally .gz)")
    parser.add_argument("--ctx", type=int, default=2048, help="window length (seqlen)")
    parser.add_argument("--max-windows", type=int, help="stop after this many windows")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--out", required=True, help="output JSON file")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    seqlen = args.ctx

    if args.c4_json:
        dataset = "c4"
        text = " ".join(c4_documents(args.c4_json, C4_DOCUMENTS))
    else:
        dataset = "wikitext2"
        rows = wikitext_rows_from_raw(args.raw) if args.raw else wikitext_rows_from_parquet(args.parquet)
        text = "\n\n".join(rows)

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    ids = tokenizer(text, return_tensors="pt").input_ids
    tokenized = ids.numel()
    if dataset == "c4":
        ids = ids[:, : C4_WINDOWS * seqlen]
    n_tokens = ids.numel()
    nsamples = n_tokens // seqlen
    windows = nsamples if args.max_windows is None else min(nsamples, args.max_windows)

    model = AutoModelForCausalLM.from_pretrained(
        args.checkpoint, torch_dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    loss_fn = torch.nn.CrossEntropyLoss()

    window_loss, window_nll, window_nll_f64 = [], [], []
    nlls = []
    start = time.time()
    with torch.no_grad():
        for i in range(windows):
            batch = ids[:, i * seqlen : (i + 1) * seqlen]
            logits = model(batch, use_cache=False).logits
            shift_logits = logits[:, :-1, :].contiguous()
            shift_labels = batch[:, 1:]
            loss = loss_fn(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.reshape(-1))
            nll = loss.float() * seqlen
            nlls.append(nll)
            logp = torch.log_softmax(shift_logits.double(), dim=-1)
            nll_f64 = -logp.gather(-1, shift_labels.unsqueeze(-1)).sum()
            window_loss.append(loss.item())
            window_nll.append(nll.item())
            window_nll_f64.append(nll_f64.item())
            print(
                f"window {i + 1}/{windows}: loss {loss.item():.6f} ({time.time() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.time() - start

    # The protocol's own arithmetic: float32 tensors summed by torch.
    ppl = torch.exp(torch.stack(nlls).sum() / (windows * seqlen)).item()
    # The same formula in float64 from the float32 per-window losses.
    ppl_f64 = math.exp(math.fsum(window_nll) / (windows * seqlen))

    result = {
        "protocol": "gptq",
        "dataset": dataset,
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "checkpoint": args.checkpoint,
        "dtype": "float32",
        "attn_implementation": model.config._attn_implementation,
        "threads": args.threads,
        "ctx": seqlen,
        "tokens_tokenized": tokenized,
        "tokens": n_tokens,
        "nsamples": nsamples,
        "windows_scored": windows,
        "max_windows": args.max_windows,
        "ppl": ppl,
        "ppl_f64": ppl_f64,
        "ppl_predicted_tokens_f64": math.exp(math.fsum(window_nll_f64) / (windows * (seqlen - 1))),
        "window_loss": window_loss,
        "window_nll": window_nll,
        "window_nll_f64": window_nll_f64,
        "first_token_ids": ids[0, :64].tolist(),
        "seconds": elapsed,
    }
    if dataset == "c4":
        result["c4_documents"] = C4_DOCUMENTS
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{dataset} ctx {seqlen}: {windows} windows of {nsamples}, PPL {ppl!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
