"""The KV cache passed and read by the name the installed transformers declares (``cache`` since its rename,
``past_key_values`` before): no FutureWarning from draftsmith's calls, the same logits either way."""

from __future__ import annotations

import inspect
import warnings

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftsmith.core.hf_cache import cache_arg, output_cache, takes


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


class OldStyle(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return input_ids


def test_the_cache_goes_by_the_name_each_forward_declares():
    model = tiny_llama()
    declared = "cache" if "cache" in inspect.unwrap(model.forward).__code__.co_varnames else "past_key_values"
    assert list(cache_arg(model, None)) == [declared]
    assert list(cache_arg(model.model.layers[0], None)) == [declared]
    assert list(cache_arg(OldStyle(), None)) == ["past_key_values"]


def test_takes_reads_the_forward_signature_of_the_module_class():
    model = tiny_llama()
    assert takes(model, "logits_to_keep") and takes(model, "position_ids")
    assert not takes(OldStyle(), "logits_to_keep") and takes(OldStyle(), "past_key_values")
    assert not takes(model.model.layers[0], "logits_to_keep")


def test_a_cached_forward_warns_nothing_and_continues_the_prefix_exactly():
    model, ids = tiny_llama(), torch.arange(1, 13)[None]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the old name warns (FutureWarning) where transformers renamed it
        whole = model(ids).logits
        cache = DynamicCache(config=model.config)
        out = model(ids[:, :8], **cache_arg(model, cache), use_cache=True)
        assert output_cache(out) is cache and cache.get_seq_length() == 8
        rest = model(ids[:, 8:], **cache_arg(model, output_cache(out)), use_cache=True).logits
    torch.testing.assert_close(rest, whole[:, 8:], rtol=1e-5, atol=1e-5)
    bad = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :8], **cache_arg(model, bad), use_cache=True)
        wrong = model(ids[:, 8:], use_cache=True).logits  # the cache not passed: the continuation differs
    assert not torch.allclose(wrong, whole[:, 8:], atol=1e-3)
