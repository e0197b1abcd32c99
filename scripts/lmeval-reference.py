#!/usr/bin/env python3
"""lm-evaluation-harness's `wikitext` task on a local checkpoint, for tests/fixtures/.

Run by scripts/lmeval-reference.sh (which makes the virtualenv and the checkpoint). Offline:
the task's documents come from a local wiki.test.raw, split into pages by the rule of
EleutherAI's `wikitext_document_level` loading script (a page starts at every line that,
after "= = =" -> "===" and "= =" -> "==" and stripping, starts with "= " and ends with " =";
whitespace-only pages are dropped except the last), written as a JSON Lines file and read
through lm-eval's own `wikitext` task (its YAML included, so its detokenizer, its
process_results and its metrics run unchanged) with only the dataset pointed elsewhere.

Writes one JSON file: per-document log-likelihoods, token/word/byte counts, the three
metrics for every requested max_length, lm-eval's own wikitext_detokenizer on tricky lines,
and the versions and the command.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


def wikitext_pages(raw_path):
    """The `page` strings of EleutherAI/wikitext_document_level for one raw split."""
    with open(raw_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    pages, current = [], []
    for line in lines:
        heading = line.replace("= = =", "===").replace("= =", "==").strip()
        if heading.startswith("= ") and heading.endswith(" ="):
            page = "\n".join(current)
            if page.strip():
                pages.append(page)
            current = []
        current.append(line)
    pages.append("\n".join(current))
    return pages


# Lines that exercise every rule of the detokenizer (and their interactions), plus real lines
# from the test split picked by the script for the characters they hold.
TRICKY_LINES = [
    " = Robert Boulter = \n",
    " = = Career = = \n",
    " = = = 2000 – 2005 = = = \n",
    " = = = = Deep = = = = \n",
    " The 1 @,@ 000 @-@ year @-@ old ship was 3 @.@ 5 m long . \n",
    " He said , \" it 's fine \" ; then : yes ! no ? \n",
    " a ( b ) c [ d ] e { f } g ( ( nested ) ) \n",
    " ' single ' and \" double \" quotes , the players ' union \n",
    " the temperature was 5 ° C and N rose \n",
    " /' 1/ odd pattern /' 12/ \n",
    " ( unclosed bracket \n and \" a quote spanning \n lines \" \n",
    "  two  spaces   and\ttabs \n \n",
    " It 's the dog 's bone ; they 've gone . \n",
    " ( ) [ ] { } \" \" ' ' \n",
    " Dürenstein – Krems : ˈnɪəroʊ ; 東京 \n",
]


def tricky_from_corpus(pages, limit=12):
    """Real lines with brackets, quotes, @-@ or headings, deterministic: the first found."""
    picked = []
    markers = ["@-@", "@,@", "@.@", " ( ", " [ ", ' " ', " ' ", "= = =", " ° ", " N "]
    for marker in markers:
        for page in pages:
            hit = next((l for l in page.split("\n") if marker in l), None)
            if hit is not None:
                picked.append(hit + "\n")
                break
        if len(picked) >= limit:
            break
    return picked


def load_detokenizer(lm_eval_dir):
    spec = importlib.util.spec_from_file_location(
        "preprocess_wikitext", lm_eval_dir / "tasks" / "wikitext" / "preprocess_wikitext.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.wikitext_detokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--raw", required=True, help="wikitext-2-raw/wiki.test.raw")
    ap.add_argument("--docs", default="all", help="comma-separated page indices, or all")
    ap.add_argument("--max-lengths", default="model", help="comma list: model (the model's own) or N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import lm_eval
    import transformers
    from lm_eval.tasks import TaskManager

    lm_eval_dir = Path(lm_eval.__file__).parent
    detok = load_detokenizer(lm_eval_dir)
    pages = wikitext_pages(args.raw)
    indices = list(range(len(pages))) if args.docs == "all" else [int(i) for i in args.docs.split(",")]

    work = Path(tempfile.mkdtemp(prefix="lmeval-wikitext-"))
    data_file = work / "test.jsonl"
    with open(data_file, "w", encoding="utf-8") as f:
        for i in indices:
            f.write(json.dumps({"page": pages[i]}) + "\n")
    (work / "wikitext_local.yaml").write_text(
        "include: {}\n"
        "task: wikitext_local\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n  data_files:\n    test: {}\n"
        "training_split: null\nvalidation_split: null\ntest_split: test\n".format(
            lm_eval_dir / "tasks" / "wikitext" / "wikitext.yaml", data_file
        )
    )
    task_manager = TaskManager(include_path=str(work))

    runs = []
    for ml in args.max_lengths.split(","):
        model_args = f"pretrained={args.checkpoint},dtype=float32"
        if ml != "model":
            model_args += f",max_length={int(ml)}"
        t0 = time.time()
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=["wikitext_local"],
            task_manager=task_manager,
            device="cpu",
            batch_size=1,
            log_samples=True,
            num_fewshot=0,
        )
        seconds = time.time() - t0
        res = out["results"]["wikitext_local"]
        samples = sorted(out["samples"]["wikitext_local"], key=lambda s: s["doc_id"])
        lm = out.get("config", {})
        docs = []
        for s in samples:
            page = s["doc"]["page"]
            resp = s["filtered_resps"][0]
            loglik = float(resp[0] if isinstance(resp, (list, tuple)) else resp)
            docs.append(
                {
                    "index": indices[s["doc_id"]],
                    "loglikelihood": loglik,
                    "words": s["word_perplexity"][1],
                    "bytes": s["byte_perplexity"][1],
                    "page_chars": len(page),
                }
            )
        runs.append(
            {
                "max_length_arg": ml,
                "model_args": model_args,
                "seconds": seconds,
                "word_perplexity": res["word_perplexity,none"],
                "byte_perplexity": res["byte_perplexity,none"],
                "bits_per_byte": res["bits_per_byte,none"],
                "documents": docs,
                "model_config": {k: lm.get(k) for k in ("model", "model_args", "batch_size", "device")},
            }
        )
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "documents"}), flush=True)

    tok = transformers.AutoTokenizer.from_pretrained(args.checkpoint)
    lines = TRICKY_LINES + tricky_from_corpus(pages)
    fixture = {
        "what": "lm-evaluation-harness task `wikitext` (loglikelihood_rolling) through its HF model, float32, CPU",
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "versions": {
            "lm_eval": importlib.metadata.version("lm_eval"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "torch_threads": torch.get_num_threads(),
        "checkpoint": "ppl export $(ppl fetch-model) --dtype f32 --format safetensors (SmolLM2-135M-Instruct Q4_1 dequantized)",
        "data": "wikitext-2-raw/wiki.test.raw, pages as EleutherAI/wikitext_document_level splits it",
        "pages_in_split": len(pages),
        "document_indices": indices,
        "prefix_token_id": tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id,
        "tokens": {str(i): len(tok.encode(detok({"page": pages[i]}))) for i in indices},
        "runs": runs,
        "detokenizer": [{"page": l, "detokenized": detok({"page": l})} for l in lines],
    }
    Path(args.out).write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
