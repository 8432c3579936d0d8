"""An architecture matrix: speculative decoding is exact on every cache and position scheme transformers ships
(full, sliding-window and mixed attention layers; rotary and learned absolute positions), stops where
``generate`` stops, and refuses in one line the architectures it cannot verify drafts on."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import transformers as tf
from test_trees import RandomTree
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution

from draftsmith.core import trees
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.network import EagleModel
from draftsmith.families.hydra.network import HydraConfig, HydraModel
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 96
WINDOW = 6  # sliding windows: shorter than prompt + generation, so keys leave the window mid-decode
LLAMA_LIKE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
COMMON = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)

# architecture -> (config class, model class, config kwargs)
ARCHITECTURES: dict[str, tuple[type, type, dict]] = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, LLAMA_LIKE),
    "mistral_sliding": (tf.MistralConfig, tf.MistralForCausalLM, {**LLAMA_LIKE, "sliding_window": WINDOW}),
    "qwen2_mixed": (  # layer 0 full attention, layer 1 sliding window
        tf.Qwen2Config,
        tf.Qwen2ForCausalLM,
        {**LLAMA_LIKE, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {**LLAMA_LIKE, "head_dim": 16}),
    "gemma2": (  # alternating sliding / global layers, logit soft-capping
        tf.Gemma2Config,
        tf.Gemma2ForCausalLM,
        {**LLAMA_LIKE, "head_dim": 16, "sliding_window": WINDOW},
    ),
    "gemma3": (
        tf.Gemma3TextConfig,
        tf.Gemma3ForCausalLM,
        {
            **LLAMA_LIKE,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3_sliding": (tf.Phi3Config, tf.Phi3ForCausalLM, {**LLAMA_LIKE, "sliding_window": WINDOW}),
    "gpt2": (  # learned absolute positions
        tf.GPT2Config,
        tf.GPT2LMHeadModel,
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=128),
    ),
    "gpt_neox": (  # partial rotary, parallel residual
        tf.GPTNeoXConfig,
        tf.GPTNeoXForCausalLM,
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    ),
    "starcoder2_sliding": (
        tf.Starcoder2Config,
        tf.Starcoder2ForCausalLM,
        {**LLAMA_LIKE, "sliding_window": WINDOW},
    ),
}

# architecture -> (config class, model class, config kwargs, why it is refused)
REFUSED: dict[str, tuple[type, type, dict, str]] = {
    "bloom": (tf.BloomConfig, tf.BloomForCausalLM, dict(hidden_size=64, n_layer=2, n_head=4), "no position_ids"),
    "mamba": (
        tf.MambaConfig,
        tf.MambaForCausalLM,
        dict(hidden_size=64, num_hidden_layers=2, state_size=4),
        "recurrent state",
    ),
}


def build(spec: tuple, seed: int, vocab: int = VOCAB, **overrides) -> tf.PreTrainedModel:
    """A tiny random model of ``spec``, sharpened so its distributions are peaked like a trained LM's."""
    config_cls, model_cls, kwargs = spec[:3]
    torch.manual_seed(seed)
    model = model_cls(config_cls(vocab_size=vocab, **{**COMMON, **kwargs, **overrides})).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def sibling(model: tf.PreTrainedModel, noise: float = 0.5, seed: int = 1) -> tf.PreTrainedModel:
    """The model with noise on its output layer: a draft LM that agrees with it often, not always."""
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = twin.get_output_embeddings().weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
    return twin


class SiblingTree(TreeDrafter):
    """Static or dynamic token trees from a sibling LM (recomputed from scratch: a reference, not fast)."""

    def __init__(self, model: tf.PreTrainedModel, policy: TreePolicy) -> None:
        self.model, self.tree = model, policy
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    @torch.no_grad()
    def _next(self, ids: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]

    def begin(self, tokens, target_out) -> list[int]:
        return tokens.tolist()

    def advance(self, state: list[int], tokens, target_out) -> None:
        state.extend(tokens.tolist())

    def root(self, state: list[int]):
        return None, self._next(state)

    def grow(self, state: list[int], scratch, tokens, parents, new) -> torch.Tensor:
        rows = []
        for node in new:
            path = []
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            rows.append(self._next(state + path[::-1]))
        return torch.stack(rows)


STATIC = TreePolicy(TreeKind.STATIC, paths=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)))
DRAFTS: dict[str, Callable[[tf.PreTrainedModel], object]] = {
    "chain": lambda m: DraftLM(sibling(m)),
    "static_tree": lambda m: SiblingTree(sibling(m), STATIC),
    "dynamic_tree": lambda m: SiblingTree(sibling(m), TreePolicy(TreeKind.DYNAMIC, size=8, top_k=3)),
}
PROMPTS = ([5, 17, 33, 2, 9, 41, 8, 12, 30, 7], [60, 3, 3, 71, 14, 22, 9])


def hf_generate(model: tf.PreTrainedModel, prompt: list[int], n: int, until_eos: bool = False) -> list[int]:
    extra = {} if until_eos else {"min_new_tokens": n}
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, **extra)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request) -> tuple[str, tf.PreTrainedModel]:
    return request.param, build(ARCHITECTURES[request.param], seed=1)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_speculative_output_equals_generate(arch, draft):
    name, model = arch
    target = Target(model, name=name)
    decoder = SpeculativeDecoder(target, DRAFTS[draft](model), 4, Sampling())
    accepted = 0
    for prompt, budget in zip(PROMPTS, (25, 23), strict=True):  # budgets that are no multiple of k + 1
        reference = hf_generate(model, prompt, budget)
        result = decoder.generate(prompt, budget)
        assert result.tokens == reference, f"{name} / {draft}"
        accepted += sum(result.accepted)
    assert accepted >= 8  # drafts were accepted (and rejected: the sibling disagrees), so cache cuts ran


@pytest.mark.parametrize("where", ["config", "generation_config"])
def test_decoding_stops_at_any_listed_eos_like_generate(arch, where):
    """Stop tokens are the config's and the generation config's ``eos_token_id`` lists together."""
    name, model = arch
    prompt = PROMPTS[0]
    plain = hf_generate(model, prompt, 25)
    first, second = plain[9], 91 if 91 not in plain[:9] else 92  # the second is listed first and never seen
    model = copy.deepcopy(model)
    if where == "config":
        model.config.eos_token_id = [second, first]
        model.generation_config = tf.GenerationConfig.from_model_config(model.config)
    else:
        model.generation_config.eos_token_id = [second, first]
    reference = hf_generate(model, prompt, 25, until_eos=True)
    assert reference[-1] == first and len(reference) <= 10
    target = Target(model, name=name)
    assert first in target.eos_token_ids
    assert plain_decode(target, prompt, 25, Sampling()).tokens == reference
    for draft in ("chain", "dynamic_tree"):
        decoder = SpeculativeDecoder(target, DRAFTS[draft](model), 4, Sampling())
        assert decoder.generate(prompt, 25).tokens == reference, f"{name} / {draft}"


@pytest.mark.parametrize("name", list(REFUSED))
def test_architectures_draftsmith_cannot_verify_are_refused_in_one_line(name):
    *spec, why = REFUSED[name]
    model = build(tuple(spec), seed=0)
    with pytest.raises(DraftsmithError, match=why) as err:
        Target(model)
    message = str(err.value)
    assert type(model).__name__ in message and "\n" not in message


def test_tree_masks_are_refused_to_an_attention_that_ignores_them():
    model = build(ARCHITECTURES["llama"], seed=0)
    model.config._attn_implementation_internal = "flash_attention_2"  # the setter would load the kernel
    target = Target(model)
    mask = trees.attention_mask(torch.tensor([-1, -1]), 0, torch.float32)  # root + two siblings
    with pytest.raises(DraftsmithError, match="flash_attention_2 attention ignores"):
        target(torch.tensor([[1, 2, 3]]), target.new_cache(), attention_mask=mask)


# ---- losslessness of speculative sampling on a sliding window and on learned positions -------------------

# architecture -> (config overrides, output layer scale: soft enough that most pairs of tokens get real mass)
SAMPLED = {
    # a window of 2 changes the target's distribution enough for 1000 samples to see a tree mask that ignores
    # it (p ~ 5e-4 when Target.layer_masks returns the mask unwindowed, ~0.35 with the window)
    "mistral_sliding": ({"sliding_window": 2, "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}, 2.0),
    "gpt2": ({"n_layer": 1, "n_embd": 32}, 0.1),
}
LONG_PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2]  # longer than the window: the sampled tokens see a sliding window


@pytest.mark.parametrize("name", list(SAMPLED))
@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_speculative_sampling_is_distributed_as_the_target(name, draft):
    overrides, scale = SAMPLED[name]
    model = build(ARCHITECTURES[name], seed=11, vocab=SMALL_V, **overrides)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    target = Target(model)
    drafter = DraftLM(sibling(model, noise=2.0)) if draft == "chain" else RandomTree(seed=5)
    sampling = Sampling(temperature=1.0)
    decoder = SpeculativeDecoder(target, drafter, 2, sampling)
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(123)
    for _ in range(1000):
        tokens = decoder.generate(LONG_PROMPT, 3, g).tokens
        counts[tokens[0] * SMALL_V + tokens[1]] += 1
    assert chi_square_pvalue(counts, exact_pair_distribution(target, LONG_PROMPT, sampling)) > 1e-3


# ---- feature drafters read a non-Llama target's hidden states (its own norms, embedding scale, layer types) ----


def feature_drafter(family: str, target: Target):
    c = target.config
    torch.manual_seed(0)
    if family.startswith("eagle"):
        version = int(family[-1])
        layers = target._check_layers((-1,) if version == 1 else (0, 1, 2))
        model = EagleModel(EagleConfig.from_target(c, version, layers, 0))
        model.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    elif family == "medusa":
        model = MedusaModel(MedusaConfig(num_heads=3, hidden_size=target.hidden_size, vocab_size=target.vocab_size))
        model.init_from_target(target.lm_head.weight)
    else:
        model = HydraModel(HydraConfig.from_target(c, target.vocab_size, num_heads=3, prefix_attention=True))
        model.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    drafter = model.as_drafter()
    drafter.tree = TreePolicy(TreeKind.DYNAMIC, size=8, top_k=3)
    return drafter


# families whose norms, layer outputs and config field names differ from Llama's
FEATURE_TARGETS = ["gemma2", "gpt2", "gpt_neox", "starcoder2_sliding"]


@pytest.mark.parametrize("name", FEATURE_TARGETS)
@pytest.mark.parametrize("family", ["eagle1", "eagle3", "medusa", "hydra"])
def test_feature_drafters_decode_non_llama_targets_exactly(family, name):
    """Gemma-2: sliding window, embedding scale, (1 + w) norms; GPT-2: learned positions, LayerNorm, Conv1D;
    GPT-NeoX: parallel residual, partial rotary; Starcoder2: sliding window, biased LayerNorm."""
    model = build(ARCHITECTURES[name], seed=1)
    target = Target(model, name=name)
    decoder = SpeculativeDecoder(target, feature_drafter(family, target), 3, Sampling())
    for prompt in PROMPTS:
        assert decoder.generate(prompt, 20).tokens == hf_generate(model, prompt, 20)


# architecture -> (its fields for the drafter's MLP width and norm epsilon, their values)
BORROWED = {
    "gemma2": ("intermediate_size, rms_norm_eps", (128, 1e-6)),
    "gpt2": ("n_inner: null (4 * n_embd), layer_norm_epsilon", (256, 1e-5)),
    "gpt_neox": ("intermediate_size, layer_norm_eps", (128, 1e-5)),
    "starcoder2_sliding": ("intermediate_size, norm_epsilon", (128, 1e-5)),
}


@pytest.mark.parametrize("name", list(BORROWED))
def test_drafter_layers_read_each_familys_names_for_the_targets_shape(name):
    config = build(ARCHITECTURES[name], seed=0).config
    eagle = EagleConfig.from_target(config, 3, (0, 1, 2), 48)
    hydra = HydraConfig.from_target(config, VOCAB, num_heads=2, prefix_attention=True)
    expected = BORROWED[name][1]
    for cfg in (eagle, hydra):
        assert (cfg.shape.hidden_size, cfg.shape.intermediate_size, cfg.shape.rms_norm_eps) == (64, *expected), (
            BORROWED[name][0]
        )
    assert (
        eagle.shape.num_attention_heads,
        eagle.shape.head_dim,
        hydra.shape.num_attention_heads,
        hydra.shape.head_dim,
    ) == (4, 16, 4, 16)
    assert eagle.shape.max_position_embeddings == config.max_position_embeddings  # GPT-2: n_positions


def test_a_target_config_without_a_borrowed_field_is_refused_in_one_line():
    config = tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)  # no MLP width: 4 * hidden
    for make, drafter in [
        (lambda: EagleConfig.from_target(config, 1, (2,)), "EAGLE-1"),
        (lambda: HydraConfig.from_target(config, VOCAB, num_heads=2), "Hydra"),
    ]:
        with pytest.raises(DraftsmithError, match=f"{drafter}: the target's BloomConfig .* no intermediate_size") as e:
            make()
        assert "\n" not in str(e.value)


# ---- logits recomputed from the final hidden state (the feature cache) are the target's -------------------

# architecture -> (config class, model class, config kwargs): families that transform the LM head's output
HEAD_TRANSFORMS: dict[str, tuple[type, type, dict]] = {
    "gemma2_capped": (*ARCHITECTURES["gemma2"][:2], {**ARCHITECTURES["gemma2"][2], "final_logit_softcapping": 2.0}),
    "gemma3_capped": (*ARCHITECTURES["gemma3"][:2], {**ARCHITECTURES["gemma3"][2], "final_logit_softcapping": 2.0}),
    "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {**LLAMA_LIKE, "logit_scale": 0.25}),
    "granite": (tf.GraniteConfig, tf.GraniteForCausalLM, {**LLAMA_LIKE, "logits_scaling": 4.0}),
    "llama": ARCHITECTURES["llama"],
    "gpt2": ARCHITECTURES["gpt2"],
}


@pytest.mark.parametrize("name", list(HEAD_TRANSFORMS))
def test_final_logits_of_the_final_hidden_state_are_the_targets_logits(name):
    model = build(HEAD_TRANSFORMS[name], seed=0)
    target = Target(model)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([PROMPTS[0]]), output_hidden_states=True)
    torch.testing.assert_close(target.final_logits(out.hidden_states[-1]), out.logits.float())
    target.check_final_logits("data.features")


def test_a_target_with_an_unknown_head_transform_is_refused_for_cached_features():
    model = build(ARCHITECTURES["llama"], seed=0)

    def temper(module, args, kwargs, out):
        out.logits = out.logits / 3.0
        return out

    model.register_forward_hook(temper, with_kwargs=True)
    with pytest.raises(DraftsmithError, match="data.features: LlamaForCausalLM transforms its LM head's output"):
        Target(model).check_final_logits("data.features")


@pytest.mark.parametrize("name", ["llama", "qwen2_mixed", "gemma2", "gemma3"])
def test_attention_windows_read_both_shapes_of_transformers_layer_kwargs(name, monkeypatch):
    """transformers before 5.2x returned one kwargs dict for all layers (the GPU image's 5.17 does); the windows must
    not depend on which shape the installed version returns."""
    from draftsmith.core import target as target_module

    model = build(ARCHITECTURES[name], seed=0)
    windows = target_module.attention_windows(model)
    config = model.config.get_text_config(decoder=True)
    types, per_layer = target_module.get_layer_types_and_kwargs(config)
    shared = next((kw for kw in per_layer if kw), {})  # the old shape: every layer's kwargs in one dict
    monkeypatch.setattr(target_module, "get_layer_types_and_kwargs", lambda _: (types, shared))
    assert target_module.attention_windows(model) == windows
    assert windows.get("sliding_attention", WINDOW) == WINDOW and windows.get("full_attention") is None
