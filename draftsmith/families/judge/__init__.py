"""Judge decoding's judge (Bachmann et al. 2025): a linear head over the target's final hidden state at a draft
token's position, trained to say whether that token is *correct* (the answer stays right) even where the target
would not have produced it. Verification keeps a draft token the lossless rule rejects when the judge accepts it:
faster, and lossy by design (``core.sampling.verify_chain_judged``; labels and training: ``families/judge/train.py``).

A judge dir holds ``config.json`` (format, hidden size, threshold, the target's fingerprint, how it was trained) and
``model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import draftsmith
from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError

FORMAT = "draftsmith.judge/1"


class JudgeHead(torch.nn.Module):
    """P(draft token correct | the target's final hidden state at its position) = sigmoid(w·h + b).

    Args:
        hidden_size: the target's hidden size.
        threshold: accept a token when its probability reaches this (chosen on held-out labels by ``fit_judge``).
    """

    def __init__(self, hidden_size: int, threshold: float = 0.5) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        self.threshold = threshold

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) final hidden states -> (...,) logits."""
        return self.linear(hidden.float()).squeeze(-1)

    @torch.no_grad()
    def accepts(self, hidden: torch.Tensor) -> list[bool]:
        """(n, H) -> whether each position's token is judged correct."""
        return (torch.sigmoid(self(hidden)) >= self.threshold).tolist()


def save_judge(head: JudgeHead, target: Target, out: str | Path, extra: dict | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, out / "model.safetensors")
    record = {
        "format": FORMAT,
        "hidden_size": head.linear.in_features,
        "threshold": head.threshold,
        "target": target.fingerprint,
        "draftsmith_version": draftsmith.__version__,
        **(extra or {}),
    }
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def load_judge(path: str | Path, target: Target, threshold: float | None = None) -> JudgeHead:
    """The judge in ``path``, checked against ``target`` (one line when it was trained for another)."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file() or not (path / "model.safetensors").is_file():
        raise DraftsmithError(
            f"--judge {path}: not a judge dir (needs config.json and model.safetensors: draftsmith judge)"
        )
    try:
        record = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{config} is not valid JSON ({e.msg})") from None
    if record.get("format") != FORMAT:
        raise DraftsmithError(f"{config}: format {record.get('format')!r} is not a judge head's ({FORMAT})")
    check_fingerprint(record["target"], target.fingerprint, f"judge head {path}")
    head = JudgeHead(record["hidden_size"], record["threshold"] if threshold is None else threshold)
    try:
        head.load_state_dict(load_file(path / "model.safetensors"))
    except (SafetensorError, RuntimeError) as e:
        raise DraftsmithError(f"{path / 'model.safetensors'}: cannot read the judge's weights ({e})") from None
    return head.eval()
