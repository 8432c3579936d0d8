"""draftsmith's packed corpus -> the token rows a peer's trainer starts from (issue 86), run in draftsmith's venv.

A peer's harness runs in the peer's own venv (``engines/peers/speculators_train.py``), which has neither
draftsmith nor its dependencies; this step writes what it needs as plain files:

- per corpus (the train corpus and the held-out val corpus), ``DIR/rows.jsonl``: one JSON line per row in the
  corpus's order, ``{"input_ids": [...], "loss_mask": [...]}`` (``loss_mask`` 1 on the tokens the target generated,
  the tokens a drafter is trained on: what speculators' ``loss_mask`` and SpecForge's ``loss_mask`` mean too), and
  ``DIR/meta.json``: the corpus's path, its target fingerprint, ``rows`` and ``generated_cumsum`` (the generated
  tokens in rows 0..i), so that the peer side takes the data of a budget by ``draftsmith.train.data.
  generated_prefix``'s rule (the shortest prefix of rows holding that many generated tokens: ``prefix_rows`` below
  is that rule over the cumsum) and trains on exactly the rows draftsmith's own fits at that budget use. The
  layout is ``prepare_specforge.py``'s (the same directory serves both peers: whichever runs first makes it);
- the target's HF directory (config + safetensors + tokenizer; ``draftsmith.targets.resolve``, built once), which
  the peer reads its verifier's config, embedding, final norm and LM head from and computes hidden states with.

Made once per corpus (``made_once``): a second call finds it made. Prints one JSON line, ``{"train": DIR, "val":
DIR, "target": DIR}``, that the peer's harness reads.

    .venv/bin/python engines/peers/prepare.py [--corpus benchmarks/data/smollm2-1m.tar.xz]
        [--val benchmarks/data/smollm2-val.tar.xz] [--target smollm2] [--out runs/peers/data]
"""

from __future__ import annotations

import argparse
import json
from bisect import bisect_left
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "data" / "smollm2-1m.tar.xz"
VAL = ROOT / "benchmarks" / "data" / "smollm2-val.tar.xz"
OUT = ROOT / "runs" / "peers" / "data"


def corpus_name(corpus: Path) -> str:
    """``smollm2-1m.tar.xz`` -> ``smollm2-1m`` (a generated dir keeps its name)."""
    name = Path(corpus).name
    return name.removesuffix(".tar.xz") if name.endswith(".tar.xz") else name


def token_rows(corpus: Path, out: Path) -> Path:
    """The corpus's rows as JSON lines, ``out/rows.jsonl``, and ``out/meta.json`` (made once); returns ``out``."""
    from draftsmith.core.files import made_once
    from draftsmith.data.shards import load_generated

    def is_made(path: Path) -> bool:
        return (path / "meta.json").is_file() and (path / "rows.jsonl").is_file()

    def make(tmp: Path) -> None:
        ds, meta = load_generated(corpus)
        tmp.mkdir(parents=True)
        cumsum, total = [], 0
        with open(tmp / "rows.jsonl", "w") as f:
            for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True):
                total += int(sum(mask))
                cumsum.append(total)
                f.write(json.dumps({"input_ids": list(map(int, ids)), "loss_mask": list(map(int, mask))}) + "\n")
        record = {"corpus": str(corpus), "target": meta.get("target"), "rows": len(cumsum), "generated_cumsum": cumsum}
        (tmp / "meta.json").write_text(json.dumps(record))

    return made_once(Path(out), is_made, make)


def prefix_rows(generated_cumsum: list[int], tokens: int | None) -> tuple[int, int]:
    """(rows, generated tokens) of the shortest prefix holding ``tokens`` generated tokens (all rows when they hold
    fewer, or when ``tokens`` is None): ``draftsmith.train.data.generated_prefix`` over a cumsum."""
    if not generated_cumsum:
        return 0, 0
    if tokens is None or tokens >= generated_cumsum[-1]:
        return len(generated_cumsum), generated_cumsum[-1]
    i = bisect_left(generated_cumsum, max(1, tokens))
    return i + 1, generated_cumsum[i]


def prepare(corpus: Path = CORPUS, val: Path = VAL, target: str = "smollm2", out: Path = OUT) -> dict:
    """The train and val rows and the target's HF dir: ``{"train": DIR, "val": DIR, "target": DIR}``."""
    from draftsmith.targets import resolve

    return {
        "train": str(token_rows(corpus, Path(out) / corpus_name(corpus))),
        "val": str(token_rows(val, Path(out) / corpus_name(val))),
        "target": str(resolve(target)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--val", type=Path, default=VAL)
    p.add_argument("--target", default="smollm2")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    print(json.dumps(prepare(a.corpus, a.val, a.target, a.out)))


if __name__ == "__main__":
    main()
