"""draftsmith's generated corpus -> the token rows SpecForge's offline EAGLE-3 data starts from (issue 86).

SpecForge's offline feature files (``scripts/prepare_hidden_states.py``) each hold one row's ``input_ids`` and
``loss_mask`` (1 on the answer's tokens) beside the target's hidden states. draftsmith's corpus already holds those
two columns for every row (``loss_mask`` 1 on the generated tokens, the same meaning), so this step only writes
them out, one JSON line per row in the corpus's order (``OUT/rows.jsonl``), for ``specforge_train.py`` (which runs
in SpecForge's venv and cannot import draftsmith) to read: ``{"input_ids": [...], "loss_mask": [...]}``. The prefix a fit at a data
budget trains on is chosen there by ``draftsmith.train.data.generated_prefix``'s rule (the shortest prefix of rows
whose ``loss_mask`` holds that many generated tokens), for which ``OUT/meta.json`` records the running total per
row, so the peer side picks exactly the rows draftsmith's own fits at that budget use.

Made once per corpus (``made_once``): a second call finds it made.

    .venv/bin/python engines/peers/prepare_specforge.py [--corpus benchmarks/data/smollm2-1m.tar.xz] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import prepare  # engines/peers/prepare.py, beside this script

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "data" / "smollm2-1m.tar.xz"
OUT = ROOT / "runs" / "peers" / "data" / "smollm2-1m"


def token_rows(corpus: Path = CORPUS, out: Path = OUT) -> Path:
    """The corpus's rows as JSON lines, ``OUT/rows.jsonl`` (made once); returns ``OUT``. ``OUT/meta.json``: the
    corpus's path, its target fingerprint, the row count and ``generated_cumsum`` (generated tokens in rows 0..i).
    ``prepare.token_rows`` with this script's defaults."""
    return prepare.token_rows(corpus, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    print(token_rows(a.corpus, a.out))


if __name__ == "__main__":
    main()
