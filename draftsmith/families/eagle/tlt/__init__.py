"""TLT: a target trained by LoRA SFT or GRPO (``policy``, on ``task``'s problems) whose rollouts are decoded
speculatively with an EAGLE drafter trained on them as the target drifts (``drafter``); ``train`` runs the loop
(``draftsmith tlt``)."""
