"""``DraftLMModule``: trains a small causal LM sharing the target's tokenizer as a drafter.

Two stages, as FastDraft (Intel, arXiv:2411.11055) and Direct Alignment (Goel et al., arXiv:2403.00858) do:
pre-train the draft LM on plain text (``loss: ce``, ``configs/draft_lm_pretrain.yaml`` over the
default target's corpus), then align it to the target by distillation on target-generated data
(``configs/draft_lm.yaml``) with forward/reverse KL, JSD(β), TVD or TVD++ against the target's logits
(online by default, or the top-k log-probabilities ``generate --store-topk`` saved). DistillSpec's
on-policy data (Zhou et al., arXiv:2310.08461; GKD, arXiv:2306.13649): with probability
``on_policy`` a batch keeps only its prompts, the student samples the continuations, and the target
labels them online. ``lora`` trains a peft LoRA adapter instead of all weights (larger students);
exports merge it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.student import StudentShape, fresh_config, load_student
from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork
from draftsmith.layers.estimate import acceptance_prob, choice
from draftsmith.layers.lora import Lora
from draftsmith.layers.losses import DIVERGENCES, distillation_loss, masked_mean, topk_teacher_logprobs
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, shift

LOSSES = ("ce", *DIVERGENCES)
"""``ce``: next-token cross-entropy on the data's tokens (pre-training); the rest distil from the target."""


class DraftLMModule(DrafterModule):
    """A draft LM trained against a frozen target.

    Args:
        target: local HF model directory of the target (``default``: the embedded default target).
        init: where the student starts: a local HF causal-LM dir sharing the target's tokenizer, or a
            draft LM checkpoint / native export (e.g. the pre-training stage's best); None: a fresh
            ``shape``.
        shape: the fresh student's shape (ignored with ``init``).
        loss: ``ce`` (pre-training on the data's tokens) or a divergence: ``fkl``, ``rkl``, ``jsd``,
            ``tvd``, ``tvd++``.
        temperature: softens target and student alike in the divergence.
        beta: JSD(β)'s mixing weight.
        teacher: ``online`` (the target's logits, computed in the step) or ``topk`` (the data's stored
            top-k target log-probabilities; on-policy batches still use the online target).
        on_policy: λ, the probability that a training batch's continuations are sampled from the student.
        student_temperature: sampling temperature of those continuations (0: greedy).
        lora: train a LoRA adapter (peft) instead of every weight; None trains all.
        seed: seeds the fresh student's init and the on-policy draws (per step and rank).
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    def __init__(
        self,
        target: str,
        init: str | None = None,
        shape: StudentShape | None = None,
        loss: str = "fkl",
        temperature: float = 1.0,
        beta: float = 0.5,
        teacher: str = "online",
        on_policy: float = 0.0,
        student_temperature: float = 1.0,
        lora: Lora | None = None,
        seed: int = 0,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if loss not in LOSSES:
            raise DraftsmithError(f"model.loss: unknown loss {loss!r} (known: {', '.join(LOSSES)})")
        if teacher not in ("online", "topk"):
            raise DraftsmithError(f"model.teacher must be 'online' or 'topk', got {teacher!r}")
        if not 0 <= on_policy <= 1:
            raise DraftsmithError(f"model.on_policy is a probability in [0, 1], got {on_policy}")
        if temperature <= 0:
            raise DraftsmithError(f"model.temperature must be > 0, got {temperature}")
        if loss == "jsd" and not 0 < beta < 1:
            raise DraftsmithError(f"model.beta must be in (0, 1) for jsd, got {beta}")
        self.init, self.shape, self.lora, self.seed = init, shape or StudentShape(), lora, seed
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()
        self.loss, self.temperature, self.beta, self.teacher = loss, temperature, beta, teacher
        self.on_policy, self.student_temperature = on_policy, student_temperature
        self.on_policy_batches = 0
        """Training batches whose continuations the student sampled (so far, in this process)."""

    # -- the student ---------------------------------------------------------------------------
    def build_drafter(self) -> DraftLMNetwork:
        lora = self.lora.peft_kwargs() if self.lora else None
        if self.init is None:
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                net = DraftLMNetwork(DraftLMConfig(fresh_config(self.target, self.shape), None))
            return DraftLMNetwork(DraftLMConfig(net.cfg.hf_config, lora), net.model) if lora else net
        model = load_student(Path(self.init), self.target)
        hf_config = json.loads(model.config.to_json_string(use_diff=False))
        return DraftLMNetwork(DraftLMConfig(hf_config, lora), model)

    # -- on-policy data --------------------------------------------------------------------------
    def _generator(self) -> torch.Generator:
        rank = self.trainer.global_rank if self._trainer else 0
        return torch.Generator().manual_seed(self.seed * 1_000_003 + self.global_step * 1009 + rank)

    @torch.no_grad()
    def student_batch(self, batch: dict, seed: int) -> dict:
        """The batch with each row's continuation replaced by one the student samples after its prompt
        (as many new tokens as the row had, fewer if the student ends with EOS); loss_mask marks them."""
        ids, mask = batch["input_ids"], batch["loss_mask"].bool()
        lengths = batch["attention_mask"].sum(1)
        prompt_lens = torch.where(mask.any(1), mask.int().argmax(1), lengths)  # first generated position
        new = (lengths - prompt_lens).tolist()
        pad = self.target.config.pad_token_id
        pad = pad if pad is not None else 0
        p = int(prompt_lens.max())
        prompts = torch.full((len(ids), p), pad, dtype=ids.dtype, device=ids.device)
        prompt_attn = torch.zeros_like(prompts)
        for i, n in enumerate(prompt_lens.tolist()):  # left-padded for generation
            prompts[i, p - n :] = ids[i, :n]
            prompt_attn[i, p - n :] = 1
        model = self.drafter.model
        was_training = model.training
        model.eval()
        sample = self.student_temperature > 0
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=prompts,
                attention_mask=prompt_attn,
                max_new_tokens=max(1, max(new)),
                do_sample=sample,
                temperature=self.student_temperature if sample else None,
                top_k=None,
                top_p=None,
                pad_token_id=pad,
                eos_token_id=list(self.target.eos_token_ids) or None,
            )
        model.train(was_training)
        continuations = out[:, p:]
        eos = self.target.eos_token_ids
        rows = []
        for i, n in enumerate(prompt_lens.tolist()):
            cont = continuations[i, : new[i]].tolist()
            stop = next((j for j, t in enumerate(cont) if t in eos), None)
            if stop is not None:
                cont = cont[: stop + 1]
            rows.append((ids[i, :n].tolist(), cont))
        t = max(len(a) + len(b) for a, b in rows)
        result = {k: torch.zeros(len(rows), t, dtype=torch.long, device=ids.device) for k in batch if k in
                  ("input_ids", "loss_mask", "attention_mask")}  # fmt: skip
        for i, (prompt, cont) in enumerate(rows):
            result["input_ids"][i, : len(prompt) + len(cont)] = torch.tensor(prompt + cont)
            result["attention_mask"][i, : len(prompt) + len(cont)] = 1
            result["loss_mask"][i, len(prompt) : len(prompt) + len(cont)] = 1
        return result

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.on_policy > 0:
            g = self._generator()
            if float(torch.rand((), generator=g)) < self.on_policy:
                batch = self.student_batch(batch, int(torch.randint(0, 2**31 - 1, (), generator=g)))
                self.on_policy_batches += 1
        return super().training_step(batch, batch_idx)

    # -- losses and the estimate -----------------------------------------------------------------
    def _uses_stored_teacher(self, batch: dict) -> bool:
        return self.teacher == "topk" and "topk_ids" in batch

    def target_forward(self, batch: dict, vocab: torch.Tensor | None = None) -> TargetOutput | None:
        if self.training and (self.loss == "ce" or self._uses_stored_teacher(batch)):
            return None  # the training loss does not need the target
        return super().target_forward(batch, vocab)

    def losses(self, batch: dict, out: TargetOutput | None) -> dict[str, torch.Tensor]:
        logits = self.drafter(batch["input_ids"], batch["attention_mask"])  # (B, T, V); row t predicts x_{t+1}
        mask = shift(batch["loss_mask"], 1)  # rows whose next token is generated text
        labels = shift(batch["input_ids"], 1)
        ce = masked_mean(F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none"), mask)
        if self.loss == "ce":
            return {"loss": ce, "ce": ce}
        if self._uses_stored_teacher(batch):
            teacher = topk_teacher_logprobs(batch["topk_ids"], batch["topk_logprobs"], logits.shape[-1])
        elif out is None:
            raise DraftsmithError("model.teacher=topk: the data has no topk_ids (generate with --store-topk K)")
        else:
            teacher = out.logits
        loss = distillation_loss(self.loss, logits, teacher, mask, self.temperature, self.beta)
        return {"loss": loss, "ce": ce}

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced on the data, the draft LM's row t+j+1 is exactly what it drafts at step j from
        anchor t once steps < j were accepted (their tokens are then the text's), so each step's acceptance
        is the per-position one shifted: exact for greedy target text under greedy acceptance."""
        sampling = Sampling(self.estimate.temperature)
        q = choice(self.drafter(batch["input_ids"], batch["attention_mask"]), sampling)
        accept = acceptance_prob(choice(out.logits, sampling), q, sampling.greedy)  # (B, T)
        steps = range(self.estimate.k)
        valid = torch.stack([shift(batch["loss_mask"], j + 2).bool() for j in steps])
        return torch.stack([shift(accept, j + 1) for j in steps]), valid
