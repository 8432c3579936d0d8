"""``EagleModule``: trains EAGLE-1 / EAGLE-3 drafters (``configs/eagle1.yaml``, ``configs/eagle3.yaml``)."""

from __future__ import annotations

import torch
from transformers import AutoConfig

from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.config import EagleConfig, config_class
from draftsmith.families.eagle.network import EagleModel
from draftsmith.layers.estimate import acceptance_prob, choice, choice_ahead
from draftsmith.layers.features import default_feature_layers
from draftsmith.layers.losses import TOKEN_LOSSES, TokenLoss, feature_regression, masked_mean, token_loss
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, read_init, shift


class EagleModule(DrafterModule):
    """EAGLE-1 / EAGLE-3 training against a frozen target (on packed batches too: ``data.pack``).

    Args:
        target: local HF model directory of the target.
        version: 1 (EAGLE-1) or 3 (EAGLE-3).
        feature_layers: target hidden_states indices to fuse; default by version.
        draft_vocab_size: EAGLE-3 reduced vocabulary size (0 = the full target vocabulary).
        ttt_steps: training-time test unroll steps (EAGLE-3; EAGLE-1 trains with 1).
        step_decay: weight of TTT step j is step_decay**j.
        reg_weight: EAGLE-1 feature-regression weight.
        cls_weight: EAGLE-1 token-loss weight (0.1 in the EAGLE paper).
        loss: the token loss of each step against the target's distribution p (``layers/losses.py``, ``TOKEN_LOSSES``):
            ``kl`` the soft cross-entropy (forward KL plus p's entropy; EAGLE's), ``nla`` -log sum_v min(p, q) and
            ``lk_hybrid`` lambda KL + (1 - lambda) TV with lambda = exp(-lk_eta sum_v min(p, q)): the LK losses
            (arXiv 2602.23881), named as speculators names them.
        lk_eta: ``lk_hybrid``'s blend temperature (3.0 in speculators and, it says, the paper's best).
        fc_norm: EAGLE-3.1: an RMSNorm on each target feature before fc (``Eagle3Config.fc_norm``).
        norm_before_fc: one RMSNorm on the concatenated features before fc (``Eagle3Config.norm_before_fc``).
        norm_output: EAGLE-3.1: the normed layer output is the next step's feature (``Eagle3Config.norm_output``).
        num_layers: EAGLE-3's decoder layers (``Eagle3Config.num_layers``; 1 as the papers, 2 the recipe study's row).
        head_init: the draft LM head's start: ``target`` its rows of the target's LM head (the draft vocabulary's),
            ``random`` PyTorch's default initialisation (SpecForge's; issue 86's study row ``eagle3_31_headrand``).
        init: a drafter of the same version to fine-tune (a checkpoint or native dir, e.g. one ``draftsmith
            import`` made of an EAGLE-3 trained elsewhere): its network, feature layers and draft vocabulary; None:
            a fresh network.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    head_init = "target"
    """The class's default (P-EAGLE, which subclasses this module, starts its head from the target's)."""

    def __init__(
        self,
        target: str,
        version: int = 3,
        feature_layers: list[int] | None = None,
        draft_vocab_size: int = 0,
        ttt_steps: int = 3,
        step_decay: float = 0.8,
        reg_weight: float = 1.0,
        cls_weight: float = 0.1,
        loss: TokenLoss = "kl",
        lk_eta: float = 3.0,
        fc_norm: bool = False,
        norm_before_fc: bool = False,
        norm_output: bool = False,
        norm_before_residual: bool = False,
        num_layers: int = 1,
        head_init: str = "target",
        init: str | None = None,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if loss not in TOKEN_LOSSES:
            raise DraftsmithError(f"model.loss must be one of {', '.join(TOKEN_LOSSES)}, got {loss!r}")
        if head_init not in ("target", "random"):
            raise DraftsmithError(f"model.head_init must be 'target' or 'random', got {head_init!r}")
        if head_init == "random" and not config_class(version).own_head:
            raise DraftsmithError(
                f"model.head_init 'random' needs a head of its own: EAGLE-{version} keeps the target's, frozen"
            )
        self.head_init = head_init
        self.version, self.requested_layers, self.draft_vocab_size = version, feature_layers, draft_vocab_size
        self.loss, self.lk_eta = loss, lk_eta
        self.norms = {"fc_norm": fc_norm, "norm_before_fc": norm_before_fc, "norm_output": norm_output}
        self.norms["norm_before_residual"] = norm_before_residual
        self.num_layers = num_layers
        self.init, self._start = init, None
        if init is not None:  # its record decides the feature layers and vocabulary before the target loads
            self._start = read_init(init, f"eagle{version}")
            self.requested_layers = list(self._start[0]["config"]["feature_layers"])
            self.draft_vocab_size = self._start[0]["config"]["draft_vocab_size"]
            for name, value in self.norms.items():  # its network has the norms it was trained with
                if value and not self._start[0]["config"].get(name, False):
                    raise DraftsmithError(f"model.{name}: model.init {init} was trained without it")
            layers = self._start[0]["config"].get("num_layers", 1)
            if num_layers not in (1, layers):  # 1, the default, takes the init's own stack
                raise DraftsmithError(f"model.num_layers={num_layers}: model.init {init} has {layers} decoder layer(s)")
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()
        self.ttt_steps = ttt_steps if config_class(version).ttt else 1
        self.step_decay, self.reg_weight, self.cls_weight = step_decay, reg_weight, cls_weight

    @property
    def packs(self) -> bool:
        """EAGLE's own losses read a packed batch's documents; a subclass with other losses (P-EAGLE) does not."""
        return type(self).losses is EagleModule.losses

    def feature_layers_for(self, target_path: str) -> tuple[int, ...]:
        if self.requested_layers:
            return tuple(self.requested_layers)
        config = AutoConfig.from_pretrained(target_path)  # its family's name for the depth (GPT-2: n_layer)
        return default_feature_layers(config.get_text_config(decoder=True).num_hidden_layers, self.version)

    def build_drafter(self) -> EagleModel:
        if self._start is not None:  # the init's own shape (an imported layer may differ from the target-derived one)
            from draftsmith.families.registry import build

            check_fingerprint(self._start[0]["target"], self.target.fingerprint, f"model.init {self.init!r}")
            return build(*self._start, f"model.init {self.init!r}").train()
        cfg = EagleConfig.from_target(
            self.target.config,
            self.version,
            self.target.feature_layers,
            self.draft_vocab_size,
            **self.norms,
            num_layers=self.num_layers,
        )
        model = EagleModel(cfg)
        model.init_from_target(self.target.embed_tokens.weight, self.target_head())
        return model

    def target_head(self) -> torch.Tensor | None:
        """What the draft LM head starts from (``head_init``): the target's LM head, or None (random)."""
        return self.target.lm_head.weight if self.head_init == "target" else None

    def prepare_from_data(self, datamodule) -> None:
        cfg = self.drafter.cfg
        if self.init is None and cfg.own_head and cfg.draft_vocab_size < cfg.vocab_size:
            self.drafter.set_draft_vocab(datamodule.token_counts(cfg.vocab_size).to(self.device))
            self.drafter.init_from_target(self.target.embed_tokens.weight, self.target_head())

    def loss_vocab(self) -> torch.Tensor | None:
        cfg = self.drafter.cfg
        return self.drafter.draft_ids if cfg.own_head and cfg.draft_vocab_size < cfg.vocab_size else None

    def _unroll(self, batch: dict, out: TargetOutput, steps: int):
        return unroll(self.drafter, batch, out, steps)

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        weights = {"step_decay": self.step_decay, "reg_weight": self.reg_weight, "cls_weight": self.cls_weight}
        return eagle_losses(self.drafter, batch, out, self.ttt_steps, self.loss, self.lk_eta, **weights)

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        sampling = Sampling(self.estimate.temperature)
        p, ids = choice(out.logits, sampling), self.drafter.draft_ids
        accept, valid = [], []
        for j, hidden, mask in self._unroll(batch, out, self.estimate.k):
            q = choice(self.drafter.logits(hidden), sampling)
            accept.append(acceptance_prob(choice_ahead(p, j + 1), q, sampling.greedy, ids))
            valid.append(mask)
        return torch.stack(accept), torch.stack(valid)


def unroll(network: EagleModel, batch: dict, out: TargetOutput, steps: int):
    """Per step j: (j, draft hidden (B,T,H), mask (B,T)); anchor i at step j predicts x_{i+j+2}, checked against
    target row i+j+1, and that token must be a generated one (``batch``: input_ids, attention_mask, loss_mask) of
    the anchor's own document (a packed batch's ``doc_ids`` / ``position_ids``, ``train.data.collate_packed``)."""
    docs = batch.get("doc_ids")
    hiddens = network(batch["input_ids"], out.features, steps, batch["attention_mask"], batch.get("position_ids"), docs)
    for j, hidden in enumerate(hiddens):
        mask = shift(batch["loss_mask"], j + 2).bool()
        if docs is not None:  # x_{i+j+2} in anchor i's document (shift pads with 0, padding's document)
            mask = mask & (shift(docs, j + 2) == docs)
        yield j, hidden, mask


def hidden_on_gpu(out: TargetOutput) -> bool:
    """Whether the target's outputs (and so the step's tensors) are on a CUDA device."""
    return out.logits.is_cuda


def eagle_losses(
    network: EagleModel,
    batch: dict,
    out: TargetOutput,
    ttt_steps: int,
    loss: TokenLoss = "kl",
    lk_eta: float = 3.0,
    step_decay: float = 0.8,
    reg_weight: float = 1.0,
    cls_weight: float = 0.1,
    dense: bool | None = None,
) -> dict[str, torch.Tensor]:
    """EAGLE's named losses (``loss`` the one optimised) of ``network`` on ``batch`` against the target's ``out``
    (logits and features over the batch; ``EagleModule``'s arguments of the same names say what each weighs).
    A plain function, so a loop that is not a ``DrafterModule`` (``families/eagle/tlt/train.py``) trains EAGLE the same way.
    ``dense``: the head over every position with the uncounted ones weighted 0 (the same losses; default on a GPU,
    where selecting the counted positions, ``hidden[mask]``, waits for the device every TTT step), else over the
    counted positions only (default on a CPU: ~30% less head and loss work)."""
    cfg = network.cfg
    # the target's distribution restricted to the draft vocabulary, renormalised: softmax of those logits
    vocab = network.draft_ids if cfg.own_head and cfg.draft_vocab_size < cfg.vocab_size else None
    logits = out.logits if vocab is None else out.logits_over(vocab)
    p_draft = torch.softmax(logits, -1)  # (B, T, Vd); row t predicts x_{t+1}
    total, logs = 0.0, {}
    name = "ce" if loss == "kl" else loss  # "ce": the name its logs have always had
    select = not (dense if dense is not None else hidden_on_gpu(out))
    for j, hidden, mask in unroll(network, batch, out, ttt_steps):
        if select:  # the head and the loss at the positions the loss counts only (~70%: prompts and padding are not)
            values = token_loss(loss, network.logits(hidden[mask]), shift(p_draft, j + 1)[mask], lk_eta)  # (n,)
        else:  # every position, the others weighted 0: no data-dependent shape, so no host-device sync on a GPU
            values = torch.where(mask, token_loss(loss, network.logits(hidden), shift(p_draft, j + 1), lk_eta), 0.0)
        token = values.sum() / mask.sum().clamp_min(1)
        logs[f"{name}_{j}"] = token
        if not cfg.own_head:  # EAGLE-1: the target's head reads the output: regress the feature
            reg = masked_mean(feature_regression(hidden, shift(out.features[0], 1)), mask)
            logs["reg"] = reg
            total = total + reg_weight * reg + cls_weight * token
        else:
            total = total + step_decay**j * token
    logs["loss"] = total
    return logs
