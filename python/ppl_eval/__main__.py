"""``python -m ppl_eval ARGS`` runs ``ppl ARGS``."""

import os
import sys

from ppl_eval import find_ppl_bin

if __name__ == "__main__":
    ppl = find_ppl_bin()
    os.execv(ppl, [ppl, *sys.argv[1:]])
