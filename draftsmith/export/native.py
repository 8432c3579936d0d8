"""Native export: draftsmith's own format (``core/native.py``) plus a model card with verifier scores.

``config.json`` holds the method, the network's config, the target fingerprint, the draftsmith
version and the training command; ``model.safetensors`` the weights; ``README.md`` the card.
Loading it back (``draftsmith score --drafter DIR``) gives the same verifier output as the source.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from draftsmith.core.fingerprint import identity_diff
from draftsmith.core.native import save_native
from draftsmith.errors import DraftsmithError
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import PlainRow, ScoreRow
from draftsmith.export.common import DTYPES, Source

RECORD = ("format", "method", "config", "target", "draftsmith_version")
"""Keys ``describe()`` writes afresh; every other key of the source's record is carried over."""


def training_command(src: Source) -> str | None:
    """How the drafter was trained: recorded in it, or LightningCLI's ``config.yaml`` near the checkpoint."""
    for key in ("training_command", "command"):
        if src.info.get(key):
            return src.info[key]
    if src.path.suffix == ".ckpt":  # a file, or DeepSpeed's directory
        for parent in list(src.path.parents)[:3]:
            if (parent / "config.yaml").is_file():
                return f"draftsmith fit --config {parent / 'config.yaml'}"
    return None


def score_rows(src: Source, reports: list[Path], name: str | None) -> list[dict]:
    """This drafter's rows of ``draftsmith score`` reports (matched by ``name``, or by its path)."""
    rows = []
    for path in reports:
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DraftsmithError(f"--scores {path}: not a readable score report.json ({e})") from None
        fp = report.get("target", {})
        if identity_diff(src.info["target"], fp) and identity_diff(fp, src.info["target"]):
            raise DraftsmithError(f"--scores {path}: scored against target {fp.get('name')!r}, not this drafter's")
        drafters = report.get("drafters", [])
        wanted = {name} if name else {str(src.path), src.path.name}
        found = [d for d in drafters if d["name"] in wanted]
        if not found and not name and len(drafters) == 1 and str(src.path) in report["config"].get("command", ""):
            found = drafters
        if not found:
            names = ", ".join(d["name"] for d in drafters)
            raise DraftsmithError(f"--scores {path}: no row for this drafter (rows: {names}); pass --score_name NAME")
        rows += [{**d, "report": str(path), "config": report["config"], "plain": report["plain"]} for d in found]
    return rows


def model_card(src: Source, info: dict, rows: list[dict], command: str | None) -> str:
    target = info["target"]
    config = {k: v for k, v in info["config"].items() if k not in ("lora", "shape")}
    config |= {f"shape.{k}": v for k, v in (info["config"].get("shape") or {}).items()}  # the layer's, one per row
    cfg = "\n".join(f"| `{k}` | `{v}` |" for k, v in config.items())
    lines = [
        f"# {info['method']} drafter for `{target['name']}`",
        "",
        f"Trained with draftsmith; exported by draftsmith {info['draftsmith_version']} from `{src.path}`.",
        "",
        "## Target",
        "",
        "| fingerprint | value |",
        "|---|---|",
        *(f"| {k} | `{v}` |" for k, v in target.items()),
        "",
        "## Network",
        "",
        "| config | value |",
        "|---|---|",
        cfg,
        "",
        "## Verifier scores",
        "",
    ]
    if not rows:
        lines += [
            "Not scored yet: `draftsmith score --target TARGET --drafter THIS_DIR`, then export with `--scores`.",
            "",
        ]
    for row in rows:
        c = row["config"]
        lines += [
            f"From `{row['report']}`: {c['num_prompts']} prompts of `{c['prompts']}`, temperature "
            f"{c['temperature']}, up to {c['max_new_tokens']} new tokens.",
            "",
            markdown_table([ScoreRow.from_dict(row)], PlainRow.from_dict(row["plain"])),
            "",
        ]
    lines += ["## Training", "", f"```\n{command}\n```" if command else "Not recorded.", ""]
    lines += ["## Use", "", f"```\ndraftsmith score --target {target['name']} --drafter THIS_DIR\n```", ""]
    return "\n".join(lines)


def export(
    src: Source, out: Path, dtype: str | None, scores: list[Path] | None = None, score_name: str | None = None
) -> str:
    """Write the native dir with its model card; return the command that scores it."""
    network = src.network.to(DTYPES[dtype]) if dtype else src.network
    command = training_command(src)
    extra = {k: v for k, v in src.info.items() if k not in RECORD and k != "command"}
    if command:
        extra["training_command"] = command
    rows = score_rows(src, scores or [], score_name)
    with torch.no_grad():
        save_native(network, SimpleNamespace(fingerprint=src.info["target"]), out, extra)
    info = json.loads((out / "config.json").read_text())
    (out / "README.md").write_text(model_card(src, info, rows, command))
    return f"draftsmith score --target {src.info['target']['name']} --drafter {out}"
