"""The pipeline's stages, one list for the local pipeline (``draftsmith pipeline`` / ``quickstart``) and the SLURM one
(``draftsmith slurm pipeline``)."""

from __future__ import annotations

STAGES = {
    "target": "the target: load it, check it, measure its step",
    "generate": "on-policy data from the target (training prompts sampled, held-out prompts greedy)",
    "features": "the target's hidden states over the training data (feature cache)",
    "fit": "train the drafters",
    "score": "score every drafter with the verifier against plain decoding of the same target",
    "export": "rank what engines serve by measured speed; export the fastest trained drafter for serving",
    "report": "the report with plots",
}
"""Every stage in order, with what it does."""
SLURM_JOBS = ("generate", "fit", "score", "export")
"""The stages ``slurm pipeline`` submits as jobs: the target is checked by each job that loads it, the feature
cache is built inside the fit job (``data.features``), the report is ``draftsmith report RUN_DIR`` afterwards."""
assert all(s in STAGES for s in SLURM_JOBS)
