"""PNG plots of score reports and training logs (matplotlib, headless)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

from draftsmith.eval.rows import PlainRow, ScoreRow

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG (tight layout, 120 dpi) and close it; the one way every plot is saved."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def acceptance_curves(rows: list[ScoreRow], path: Path) -> Path:
    """Per draft position: share of rounds whose i-th token was accepted, and acceptance given reached."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for row in rows:
        pos = range(1, len(row.accept_at) + 1)
        axes[0].plot(pos, row.accept_at, marker="o", label=f"{row.name} (τ {row.tau:.2f})")
        axes[1].plot(pos, row.accept_given_reached, marker="o", label=row.name)
    axes[0].set(title="rounds accepting the i-th draft token", xlabel="draft position i", ylabel="share")
    axes[1].set(title="accepted, given position i was reached", xlabel="draft position i")
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.set_xticks(range(1, max(len(r.accept_at) for r in rows) + 1))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save(fig, path)


def tau_vs_k(by_k: dict[int, list[ScoreRow]], path: Path) -> Path:
    """Mean accepted length τ and wall-clock speedup against the draft length K, per drafter."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(dict.fromkeys(r.name for rows in by_k.values() for r in rows))
    ks = sorted(by_k)
    for name in names:
        pts = [(k, r) for k in ks for r in by_k[k] if r.name == name]
        axes[0].plot([k for k, _ in pts], [r.tau for _, r in pts], marker="o", label=name)
        axes[1].plot([k for k, _ in pts], [r.speedup for _, r in pts], marker="o", label=name)
    axes[0].plot(ks, [k + 1 for k in ks], ls=":", color="gray", label="every draft accepted (K+1)")
    axes[1].axhline(1.0, ls=":", color="gray", label="plain decoding")
    axes[0].set(title="τ: tokens per target call", xlabel="K (tokens drafted per round)", ylabel="τ")
    axes[1].set(title="wall-clock speedup over plain decoding", xlabel="K", ylabel="speedup ×")
    for ax in axes:
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def speedup_bars(rows: list[ScoreRow], plain: PlainRow, path: Path) -> Path:
    """Measured speedup per drafter beside its ideal bound τ/(r+K̄c); lines mark plain decoding and the n-gram."""
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows) + 2), 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.speedup for r in rows], width=0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [r.ideal_speedup for r in rows], width=0.4, alpha=0.5, label="ideal τ/(r+K̄c)")
    for i, r in enumerate(rows):
        ax.text(i - 0.2, r.speedup, f"{r.speedup:.2f}×", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, ls=":", color="gray", label="plain decoding (1×)")
    ngram = next((r for r in rows if r.name == "ngram"), None)
    if ngram is not None:  # the free baseline a trained drafter must beat to be worth its training
        ax.axhline(ngram.speedup, ls="--", color="tab:red", label=f"n-gram, no training ({ngram.speedup:.2f}×)")
    ax.set_xticks(list(x), [r.name for r in rows], rotation=20)
    ax.set(ylabel="× plain decoding", title=f"speedup (plain decoding: {plain.tokens_per_s:.0f} tokens/s)")
    ax.legend(fontsize=8)
    return save(fig, path)


def read_metrics(path: Path) -> list[dict]:
    """Lightning CSVLogger's metrics.csv as rows of floats (empty cells dropped)."""
    with open(path) as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def training_curves(logs: dict[str, list[dict]], path: Path) -> Path:
    """Training loss and ``val/tau_est`` against the step, per drafter."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in logs.items():
        train = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
        val = [(r["step"], r["val/tau_est"]) for r in rows if "val/tau_est" in r]
        axes[0].plot(*zip(*train, strict=True), label=name) if train else None
        axes[1].plot(*zip(*val, strict=True), marker="o", label=name) if val else None
    axes[0].set(title="training loss", xlabel="step", ylabel="loss", yscale="log")
    axes[1].set(title="val/tau_est (= verifier τ on greedy data)", xlabel="step", ylabel="τ")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)
