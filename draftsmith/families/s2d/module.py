"""``S2DModule``: S2D's sorted draft LM, trained against several targets of one family in one run.

S2D (Kavehzadeh et al. 2024, arXiv:2407.01955, §3) trains its draft with Sorted Fine-Tuning (SoFT, Sorted LLaMA,
arXiv:2309.08968, §3): sub-network n is the draft's first n decoder layers followed by the shared output head, and the
loss is the mean of every sub-network's own loss, L = (1/|B|) Σ_{n∈B} L_n, each sub-network weighted alike. S2D's
draft learns from one corpus, whichever target it later serves; here each target t of the family brings its own
generated data and (for a divergence) its own logits, so every (sub-network, target) pair has a loss L_{n,t}, and the
loss is SoFT's mean taken over the pairs (``sorted_loss``):

    L = 1 / (|B| |T|) Σ_{n∈B} Σ_{t∈T} L_{n,t}

with L_{n,t} sub-network n's loss on a batch of target t's data: the next-token cross-entropy of that data's tokens
(``loss: ce``; then L is SoFT's loss on the union of the targets' data, one batch of each per step) or a divergence
from target t's distribution (``fkl``, ``rkl``, ``jsd``, ``tvd``, ``tvd++``: DistillSpec's losses, as the draft LM
family distils). Validation replays the verifier's greedy rounds for every pair (``val/tau_est/L{n}_T{t}``);
``val/tau_est`` is their mean. ``score`` then drafts for each target with the sub-network of highest predicted speed
(``families.s2d.exits``), and ``export_subnetwork`` writes any sub-network as an ordinary draft LM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from draftsmith import targets as builtin
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.families.s2d.network import S2DConfig, S2DNetwork, check_exits
from draftsmith.families.student import StudentShape, fresh_config, load_student
from draftsmith.layers.estimate import acceptance_prob, choice, replay_rounds, tau_from_rounds
from draftsmith.layers.losses import DIVERGENCES, distillation_loss, masked_mean
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, config_target, shift
from draftsmith.targets import ResolvedTarget

LOSSES = ("ce", *DIVERGENCES)


def exit_losses(
    exits: dict[int, torch.Tensor],
    batch: dict,
    teacher: torch.Tensor | None,
    loss: str = "fkl",
    temperature: float = 1.0,
    beta: float = 0.5,
) -> dict[int, torch.Tensor]:
    """Each sub-network's loss on one target's batch.

    Args:
        exits: sub-network depth -> its (B, T, V) logits on ``batch`` (``S2DNetwork.exit_logits``).
        batch: a collated batch of the target's generated data (``input_ids``, ``loss_mask``: 1 on generated tokens).
        teacher: the target's (B, T, V) logits on it (None for ``ce``).
        loss: ``ce`` or a divergence of ``layers.losses.DIVERGENCES``.
        temperature: softens teacher and student alike in the divergence.
        beta: JSD(β)'s weight.
    """
    mask = shift(batch["loss_mask"], 1)  # rows whose next token is generated text; row i predicts token i+1
    labels = shift(batch["input_ids"], 1)
    out = {}
    for n, logits in exits.items():
        if loss == "ce":
            out[n] = masked_mean(F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none"), mask)
        else:
            out[n] = distillation_loss(loss, logits, teacher, mask, temperature, beta)
    return out


def pair_losses(
    network: S2DNetwork,
    batches: list[dict],
    teachers: list[torch.Tensor | None],
    loss: str = "fkl",
    temperature: float = 1.0,
    beta: float = 0.5,
) -> dict[tuple[int, int], torch.Tensor]:
    """L_{n,t} for every sub-network n and target t: sub-network n's loss (``exit_losses``) on ``batches[t]``, a
    batch of target t's data, against ``teachers[t]``, target t's logits on it (None for ``ce``)."""
    out = {}
    for t, (batch, teacher) in enumerate(zip(batches, teachers, strict=True)):
        exits = network.exit_logits(batch["input_ids"], batch["attention_mask"])
        out |= {(n, t): v for n, v in exit_losses(exits, batch, teacher, loss, temperature, beta).items()}
    return out


def sorted_loss(losses: dict[tuple[int, int], torch.Tensor]) -> torch.Tensor:
    """SoFT's loss over (sub-network, target) pairs: their mean, every pair weighted 1 / (|B| |T|)."""
    return torch.stack(list(losses.values())).mean()


class S2DModule(DrafterModule):
    """A sorted draft LM trained against several targets that share a tokenizer (``configs/s2d.yaml``).

    Args:
        targets: the targets (built-in names such as ``default-2``, ``default-4``, ``default-8``, or local HF dirs,
            each optionally ``:DTYPE``), in the order of the data module's data dirs.
        exits: the sub-networks' depths (decoder layers), the deepest the whole draft; None: every depth.
        init: where the draft starts: a local HF causal-LM dir sharing the targets' tokenizer, a draft LM or sorted
            draft LM checkpoint / native export; None: a fresh ``shape``.
        shape: the fresh draft's shape (ignored with ``init``).
        loss: ``ce`` (next-token cross-entropy on each target's data) or a divergence from each target's logits:
            ``fkl``, ``rkl``, ``jsd``, ``tvd``, ``tvd++``.
        temperature: softens target and draft alike in the divergence.
        beta: JSD(β)'s mixing weight.
        seed: seeds the fresh draft's init.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate (per pair, and their mean).
    """

    def __init__(
        self,
        targets: list[str],
        exits: list[int] | None = None,
        init: str | None = None,
        shape: StudentShape | None = None,
        loss: str = "fkl",
        temperature: float = 1.0,
        beta: float = 0.5,
        seed: int = 0,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if not targets:
            raise DraftsmithError("model.targets: name at least one target")
        if loss not in LOSSES:
            raise DraftsmithError(f"model.loss: unknown loss {loss!r} (known: {', '.join(LOSSES)})")
        if temperature <= 0:
            raise DraftsmithError(f"model.temperature must be > 0, got {temperature}")
        if loss == "jsd" and not 0 < beta < 1:
            raise DraftsmithError(f"model.beta must be in (0, 1) for jsd, got {beta}")
        self.exits, self.init, self.shape, self.seed = exits, init, shape or StudentShape(), seed
        super().__init__(str(targets[0]), optim, estimate)
        self.save_hyperparameters()
        self.loss, self.temperature, self.beta = loss, temperature, beta
        others = [builtin.load_target(config_target(t), batch_invariant=False) for t in targets[1:]]
        self.family: list[Target] = [self.target, *others]
        """Every target, in ``targets``' order (plain attributes: neither trained nor saved)."""
        for name, t in zip(targets[1:], others, strict=True):
            if (
                t.vocab_size != self.target.vocab_size
                or t.fingerprint["tokenizer_hash"] != (self.target.fingerprint["tokenizer_hash"])
            ):
                raise DraftsmithError(
                    f"model.targets: {name} has another vocabulary or tokenizer than {targets[0]}: one sorted draft LM "
                    "drafts for targets that share a tokenizer"
                )

    # -- the draft -------------------------------------------------------------------------------
    def build_drafter(self) -> S2DNetwork:
        if self.init is None:
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                hf_config = fresh_config(self.target, self.shape)
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config))
        else:
            model = self._load_init(Path(self.init))
            hf_config = json.loads(model.config.to_json_string(use_diff=False))
        layers = hf_config["num_hidden_layers"]
        exits = check_exits(self.exits if self.exits is not None else range(1, layers + 1), layers, "model.exits")
        return S2DNetwork(S2DConfig(hf_config, exits), model)

    def _load_init(self, path: Path):
        """The causal LM ``init`` names: a HF dir (``load_student``), or a draft LM / sorted draft LM checkpoint or
        native dir made for any target of this tokenizer (e.g. the corpus pre-training of another family member)."""
        from draftsmith.core.native import is_native
        from draftsmith.families.registry import load_network

        if not (path.exists() and (path.suffix == ".ckpt" or is_native(path))):
            return load_student(path, self.target)
        network, info = load_network(path)
        if info["method"] not in ("draft_lm", "s2d"):
            raise DraftsmithError(f"model.init: {path} holds a {info['method']} drafter, not a draft LM")
        made, ours = info["target"], self.target.fingerprint
        if (made.get("vocab_size"), made.get("tokenizer_hash")) != (ours["vocab_size"], ours["tokenizer_hash"]):
            raise DraftsmithError(f"model.init: {path} was made for a target of another vocabulary or tokenizer")
        model = network.merged().model if info["method"] == "draft_lm" else network.model
        return model.to(self.target.device).train()

    # -- Lightning -------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        for t in self.family:
            t.model.to(self.device)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None:
            if not hasattr(datamodule, "check_targets"):
                raise DraftsmithError(
                    "data: a sorted draft LM trains on one data dir per target: use data.class_path "
                    "draftsmith.families.s2d.train_data.S2DDataModule with data.train (and data.val) listing them"
                )
            datamodule.check_targets(self.family)

    def on_fit_start(self) -> None:
        for t in self.family:
            t.model.to(self.device)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["draftsmith"]["targets"] = [t.fingerprint for t in self.family]
        if self.pair_tau is not None:
            checkpoint["draftsmith"]["val_tau_est_pairs"] = self.pair_tau

    def teachers(self, batches: list[dict]) -> list[torch.Tensor | None]:
        if self.loss == "ce":
            return [None] * len(batches)
        return [
            t(b["input_ids"], attention_mask=b["attention_mask"]).logits
            for t, b in zip(self.family, batches, strict=True)
        ]

    def training_step(self, batches: list[dict], batch_idx: int) -> torch.Tensor:
        losses = pair_losses(self.drafter, batches, self.teachers(batches), self.loss, self.temperature, self.beta)
        loss = sorted_loss(losses)
        n = sum(len(b["input_ids"]) for b in batches)
        logged = {
            f"train/loss_L{e}": sorted_loss({k: v for k, v in losses.items() if k[0] == e}) for e in self.drafter.exits
        }
        self.log_dict({"train/loss": loss, **logged}, prog_bar=True, batch_size=n)
        return loss

    pair_tau: dict[str, list[float]] | None = None
    """From the last validation: per sub-network depth, ``val/tau_est`` on each target's data (targets' order)."""

    def on_validation_epoch_start(self) -> None:
        pairs = len(self.drafter.exits) * len(self.family)
        self._val = torch.zeros(pairs, 4, device=self.device)  # per pair: (tokens, rounds, loss sum, rows)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        t = dataloader_idx
        teacher = self.family[t](batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        exits = self.drafter.exit_logits(batch["input_ids"], batch["attention_mask"])
        losses = exit_losses(
            exits, batch, None if self.loss == "ce" else teacher, self.loss, self.temperature, self.beta
        )
        rows = len(batch["input_ids"])
        for i, n in enumerate(self.drafter.exits):
            accept, valid = self.step_acceptance_of(batch, exits[n], teacher)
            rounds = replay_rounds(accept.cpu(), valid.cpu(), torch.Generator().manual_seed(batch_idx))
            tokens, count = tau_from_rounds(rounds)
            row = i * len(self.family) + t
            self._val[row] += torch.tensor([tokens, count, float(losses[n]) * rows, rows], device=self.device)

    def on_validation_epoch_end(self) -> None:
        totals = self.trainer.strategy.reduce(self._val, reduce_op="sum").view(len(self.drafter.exits), -1, 4)
        tau = (totals[..., 0] / totals[..., 1].clamp_min(1)).tolist()
        loss = (totals[..., 2] / totals[..., 3].clamp_min(1)).tolist()
        self.pair_tau = {str(n): [round(x, 6) for x in tau[i]] for i, n in enumerate(self.drafter.exits)}
        for i, n in enumerate(self.drafter.exits):
            for t in range(len(self.family)):
                self.log(f"val/tau_est/L{n}_T{t}", tau[i][t])
        self.log("val/tau_est", sum(map(sum, tau)) / totals[..., 0].numel(), prog_bar=True)
        self.log("val/loss", sum(map(sum, loss)) / totals[..., 0].numel())

    @torch.no_grad()
    def step_acceptance_of(
        self, batch: dict, logits: torch.Tensor, teacher: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, B, T) acceptance of draft step j from anchor t of one sub-network (its ``logits``) against
        ``teacher``'s, teacher-forced as ``DraftLMModule.step_acceptance`` (exact on greedy data)."""
        sampling = Sampling(self.estimate.temperature)
        accept = acceptance_prob(choice(teacher, sampling), choice(logits, sampling), sampling.greedy)  # (B, T)
        steps = range(self.estimate.k)
        valid = torch.stack([shift(batch["loss_mask"], j + 2).bool() for j in steps])
        return torch.stack([shift(accept, j + 1) for j in steps]), valid


def export_subnetwork(src: str | Path, depth: int, target: ResolvedTarget, out: Path, overwrite: bool = False) -> Path:
    """Write sub-network ``depth`` of a trained sorted draft LM as an ordinary draft LM for ``target`` (one of the
    targets it was trained with): a native ``draft_lm`` dir (``--drafter OUT``; ``draftsmith export OUT --to hf``)
    and, in ``OUT/hf``, a plain Hugging Face model dir with the target's tokenizer, which ``transformers`` serves as
    an assistant model and vLLM as a ``draft_model``.

    Args:
        src: the sorted draft LM's checkpoint (``.ckpt``) or native dir.
        depth: the sub-network's decoder layers (one of the draft's exits).
        target: the target it will draft for: a built-in name or a model dir, optionally ``:DTYPE`` (from Python a
            ``targets.ResolvedTarget``: ``draftsmith.cli`` resolves it once).
        out: the directory to write.
        overwrite: replace an existing ``out`` (the old one stays until the new one is whole).
    """
    from draftsmith.core.files import made_whole, refuse_existing
    from draftsmith.core.native import save_native
    from draftsmith.families.registry import load_network

    if not Path(src).exists():
        raise DraftsmithError(f"--src {src} does not exist")
    refuse_existing(Path(out), overwrite, "s2d export")
    target_obj = builtin.load_target(target)
    network, info = load_network(src, target_obj)
    if info["method"] != "s2d":
        raise DraftsmithError(f"--src {src} holds a {info['method']} drafter, not an s2d one")
    sub = network.subnetwork(depth)

    def write(tmp: Path) -> None:
        save_native(sub, target_obj, tmp, {"s2d": {"source": str(src), "layers": depth, "exits": list(network.exits)}})
        sub.model.save_pretrained(tmp / "hf")
        target_obj.tokenizer.save_pretrained(tmp / "hf")

    out = made_whole(Path(out), write)
    print(f"wrote {out} (native draft_lm) and {out / 'hf'} (Hugging Face draft model): sub-network {depth} of {src}")
    return out
