"""ppl from Python: ``evaluate(model, data, **options)`` runs the ``ppl`` binary this package
installed and returns its results.json as a dict.

    >>> from ppl_eval import evaluate
    >>> r = evaluate("hf:HuggingFaceTB/SmolLM2-135M-Instruct", "wikitext-2", ctx=512, chunks=40)
    >>> r["ppl"], r["ppl_err"]

Each keyword is the ``ppl eval`` flag of that name (``chunks=40`` is ``--chunks 40``,
``batch_size=8`` is ``--batch-size 8``; ``True`` passes a bare flag, ``None``/``False`` leave
it out). A failed evaluation raises :class:`PplError` with ppl's own message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

__all__ = ["PplError", "evaluate", "find_ppl_bin", "run"]


class PplError(RuntimeError):
    """ppl exited with an error; the message is ppl's (what failed and the fix)."""


def find_ppl_bin() -> str:
    """The ``ppl`` binary installed with this package (else the first on PATH)."""
    exe = "ppl" + (".exe" if sys.platform == "win32" else "")
    scheme = "nt_user" if os.name == "nt" else "posix_user"
    for scripts in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", scheme)):
        if scripts:
            path = os.path.join(scripts, exe)
            if os.path.isfile(path):
                return path
    found = shutil.which(exe)
    if found is None:
        raise PplError("the ppl binary was not found beside this package nor on PATH; reinstall ppl-eval")
    return found


def _flags(options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                args += [flag, str(v)]
        else:
            args += [flag, str(value)]
    return args


def run(*args: str) -> str:
    """Runs ``ppl ARGS`` and returns its standard output; raises PplError on failure."""
    p = subprocess.run([find_ppl_bin(), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise PplError(p.stderr.strip() or f"ppl {' '.join(args)} exited with {p.returncode}")
    return p.stdout


def evaluate(model: str | os.PathLike, data: str | os.PathLike, **options: Any) -> dict:
    """Evaluates ``model`` (a GGUF file, a checkpoint directory, or ``hf:ORG/NAME…``) on
    ``data`` (a file, or a dataset name such as ``wikitext-2``) and returns results.json."""
    with tempfile.TemporaryDirectory(prefix="ppl-eval-") as tmp:
        out = os.path.join(tmp, "results.json")
        run("eval", "--model", os.fspath(model), "--data", os.fspath(data),
            *_flags(options), "--output", out, "--quiet", "--progress", "none")
        with open(out, encoding="utf-8") as f:
            return json.load(f)
