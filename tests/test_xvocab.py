"""Cross-vocabulary drafting (issue 33): a draft LM with another tokenizer drafts for the target through text.

The draft tokenizer is a byte-level BPE trained here on the target's text (another vocabulary and segmentation than
the target's word-level one); the draft LM is distilled on the target's greedy text re-tokenized in its own
vocabulary, so its drafts get accepted and the translation is exercised for real.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama, make_tokenizer
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from draftsmith.core.sampling import Sampling, one_hot
from draftsmith.core.target import Target
from draftsmith.decode import verifier as verifier_module
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import load_drafter
from draftsmith.families.xvocab.drafter import XVocabDrafter
from draftsmith.targets import resolve_target


def byte_bpe(texts: list[str], vocab: int = 300) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def distil_on_text(model, tokenizer, texts: list[str], steps: int = 150) -> None:
    """Sequence-level distillation across vocabularies: the target's text, in the draft's own tokens."""
    rows = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def xvocab_drafter(target, tokenizer):
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 90, (n,), generator=g).tolist() for n in (4, 6, 8, 5, 7, 9)]
    texts = [tokenizer.decode(p + plain_decode(target, p, 32, Sampling()).tokens) for p in prompts]
    draft_tok = byte_bpe(texts)
    model = make_llama(seed=3, layers=1, hidden=48, vocab=len(draft_tok))
    distil_on_text(model, draft_tok, texts)
    return XVocabDrafter(model, draft_tok, tokenizer), draft_tok, prompts


def test_the_draft_vocabulary_differs_from_the_targets(xvocab_drafter, tokenizer):
    _, draft_tok, prompts = xvocab_drafter
    text = tokenizer.decode(prompts[0])
    assert len(draft_tok) != len(tokenizer)
    assert draft_tok.encode(text, add_special_tokens=False) != tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("k", [2, 4])
def test_cross_vocabulary_greedy_equals_plain_greedy_and_drafts_get_accepted(target, xvocab_drafter, k):
    drafter, _, prompts = xvocab_drafter
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    accepted = drafted = 0
    for prompt in prompts:
        result = decoder.generate(prompt, 32)
        assert result.tokens == plain_decode(target, prompt, 32, Sampling()).tokens
        accepted, drafted = accepted + sum(result.accepted), drafted + sum(result.drafted)
    # distilled on this text, the translated drafts are mostly the target's own tokens
    assert drafted > 0 and accepted / drafted > 0.5


def test_translation_reforms_the_boundary_and_memoizes(xvocab_drafter, tokenizer):
    drafter = XVocabDrafter(xvocab_drafter[0].lm.model, xvocab_drafter[1], tokenizer)
    tail = tokenizer.encode("w1 w2 w3", add_special_tokens=False)
    assert drafter._translate("w1 w2 w3", " w5 w61", tail) == tokenizer.encode("w5 w61", add_special_tokens=False)
    assert drafter._translate("w1 w2 w3", " w5 w61", tail) == tokenizer.encode("w5 w61", add_special_tokens=False)
    assert drafter.memo_hits == 1 and drafter.translations == 2


@pytest.fixture(scope="module")
def soft_pair():
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    words = make_tokenizer(SMALL_V)
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(0, SMALL_V - 2, (30,), generator=g)) for _ in range(20)]
    draft_tok = byte_bpe(texts, vocab=270)
    return target, XVocabDrafter(make_llama(seed=5, layers=1, hidden=32, vocab=len(draft_tok)), draft_tok, words)


def xvocab_pairs(target: Target, drafter: XVocabDrafter, sampling: Sampling) -> torch.Tensor:
    """Counts of (x1, x2) over 1,500 decodes: x2 from verifying the translated draft (a point mass, q = None)."""
    decoder = SpeculativeDecoder(target, drafter, 2, sampling)
    counts, drafted = torch.zeros(SMALL_V * SMALL_V), 0
    g = torch.Generator().manual_seed(7)
    for _ in range(1500):
        result = decoder.generate([1, 2, 3], 3, g)
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
        drafted += sum(result.drafted)
    assert drafted > 0
    return counts


def test_cross_vocabulary_sampling_is_distributed_as_the_target(soft_pair):
    target, drafter = soft_pair
    sampling = Sampling(temperature=0.8, top_p=0.9)
    counts = xvocab_pairs(target, drafter, sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(target, [1, 2, 3], sampling)) > 1e-3


def test_chi_square_catches_a_point_mass_verified_as_a_smoothed_distribution(soft_pair, monkeypatch):
    """The translated drafts are deterministic (q = None): the verifier's point mass on each token makes its
    acceptance p(d) and the residual p without d. Smoothed toward uniform (as if the drafter had sampled the token),
    acceptance and residual are wrong, and the chi-square must see it."""
    monkeypatch.setattr(verifier_module, "one_hot", lambda t, v: 0.5 * one_hot(t, v) + 0.5 / v)
    target, drafter = soft_pair
    sampling = Sampling(temperature=0.8, top_p=0.9)
    counts = xvocab_pairs(target, drafter, sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(target, [1, 2, 3], sampling)) < 1e-3


def test_xvocab_spec_scores_and_bad_drafts_fail_in_one_line(target, xvocab_drafter, tmp_path, prompts):
    drafter, draft_tok, _ = xvocab_drafter
    good = tmp_path / "draft"
    drafter.lm.model.save_pretrained(good)
    draft_tok.save_pretrained(good)
    rows = score_drafters(target, {"x": load_drafter(f"xvocab:{good}", target)}, prompts, 3, Sampling(), 8, 0, False)[1]
    assert rows[0].greedy_exact == len(prompts) and "translation_memo_hits" in rows[0].extra
    bare = tmp_path / "bare"
    drafter.lm.model.save_pretrained(bare)
    with pytest.raises(DraftsmithError, match="no tokenizer in"):
        load_drafter(f"xvocab:{bare}", target)
    with pytest.raises(DraftsmithError, match="not a model directory with config.json"):
        load_drafter(f"xvocab:{tmp_path / 'nothing'}", target)
    words = tmp_path / "words"
    drafter.lm.model.save_pretrained(words)
    make_tokenizer(salt="x").save_pretrained(words)
    with pytest.raises(DraftsmithError, match="does not round-trip text"):
        load_drafter(f"xvocab:{words}", target)
    with pytest.raises(DraftsmithError, match=r"must share a tokenizer \(a draft model with its own: xvocab:DIR\)"):
        score_drafters(target, {"plain": load_drafter(str(good), target)}, prompts, 3, Sampling(), 8, 0, False)


WORDS = [
    "the",
    "a",
    "model",
    "token",
    "draft",
    "target",
    "text",
    "speed",
    "fast",
    "slow",
    "verify",
    "accept",
    "reject",
    "sample",
    "word",
]


def ascii_bpe(texts: list[str], vocab: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE whose alphabet is only the texts' characters (a model sampling from it writes ASCII), with
    an end-of-sequence token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> dict:
    """A word-ish target with an ASCII BPE, a draft LM with a byte-level BPE (both saved), and the target's sampled
    generations on 40 prompts."""
    import json

    from draftsmith.data.generate import generate

    root = tmp_path_factory.mktemp("hybrid")
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (12,), generator=g)) for _ in range(40)]
    target_tok, draft_tok = ascii_bpe(texts, 120), byte_bpe(texts, 330)
    target_model = make_llama(seed=5, layers=1, hidden=48, vocab=len(target_tok), eos=target_tok.eos_token_id)
    with torch.no_grad():
        target_model.lm_head.weight.mul_(6.0)  # peaked: a distribution worth learning
    target_dir, draft_dir = root / "target", root / "draft"
    for model, tok, path in [(target_model, target_tok, target_dir), (make_llama(6, 1, 48, len(draft_tok)), draft_tok, draft_dir)]:  # fmt: skip
        model.save_pretrained(path)
        tok.save_pretrained(path)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t[:30]}) + "\n" for t in texts))
    generate(
        resolve_target(str(target_dir)), str(root / "prompts.jsonl"), root / "data", temperature=1.0, max_new_tokens=24
    )
    return {"target": target_dir, "draft": draft_dir, "data": root / "data", "target_tok": target_tok,
            "draft_tok": draft_tok, "target_model": target_model}  # fmt: skip


def test_hybrid_distillation_aligns_both_vocabularies_and_learns_the_targets_shared_tokens(hybrid, tmp_path):
    """OmniDraft's token-level half: pairs where both tokenizations start a token at the same character predict the
    next token after the same text; the target's side is its distribution there over the shared tokens (recomputed
    here from the prefix alone); distillation (through ``fit``) lowers the draft's cross-entropy to it."""
    import json

    from draftsmith.data.shards import load_generated
    from draftsmith.families.xvocab.train import (
        TOP_K,
        distill_across_vocab,
        draft_rows,
        shared_vocabulary,
        token_targets,
    )

    target_tok, draft_tok, target_model = hybrid["target_tok"], hybrid["draft_tok"], hybrid["target_model"]
    target_dir, draft_dir, data = hybrid["target"], hybrid["draft"], hybrid["data"]
    shared = shared_vocabulary(target_tok, draft_tok)
    assert 10 < len(shared) < len(target_tok)
    assert all(target_tok.decode([t]) == draft_tok.decode([d]) for t, d in shared.items())
    rows, pairs = draft_rows(data, target_tok, draft_tok, 512)
    dataset, _ = load_generated(data)
    assert sum(map(len, pairs)) > len(rows)  # most answers align somewhere beyond their first token
    for row, aligned, generated in zip(rows, pairs, dataset, strict=True):
        ids, start = generated["input_ids"], generated["prompt_len"]
        for t, d in aligned:  # the same answer text before the token each side predicts
            assert target_tok.decode(ids[start : t + 1]) == draft_tok.decode(row.ids[row.prompt_len : d + 1])

    token_targets(target_model, data, rows, pairs, shared)
    row, aligned, generated = next((r, a, x) for r, a, x in zip(rows, pairs, dataset, strict=True) if len(a) > 2)
    (t, d), (d_again, index, p) = aligned[2], row.aligned[2]
    with torch.no_grad():  # the prefix alone: no later token may leak into the target's side
        logits = target_model(input_ids=torch.tensor([generated["input_ids"][: t + 1]])).logits[0, -1]
    full = torch.softmax(logits, -1)[list(shared)]
    top = full.topk(TOP_K)
    assert d_again == d and index == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(p), top.values / top.values.sum(), atol=1e-5, rtol=1e-4)

    out = distill_across_vocab(draft_dir, target_dir, data, tmp_path / "hybrid", steps=30, batch_size=8, lr=3e-3,
                               token_weight=1.0)  # fmt: skip
    record = json.loads((out / "distill.json").read_text())
    print(record)
    assert record["shared_vocabulary"] == len(shared) and 0 < record["aligned_share"] <= 1
    assert record["token_loss_last"] < 0.8 * record["token_loss_first"]
    assert (out / "tokenizer.json").is_file() and (out / "fit" / "manifest.json").is_file()
    with pytest.raises(DraftsmithError, match="--token_weight must be at least 0"):
        distill_across_vocab(draft_dir, target_dir, data, tmp_path / "x", token_weight=-1.0)


def test_an_interrupted_xvocab_fit_resumes_where_it_stopped(hybrid, tmp_path, monkeypatch, capsys):
    """Run again with the same settings after an interruption (here at step 10, after the step-8 checkpoint), the
    distillation resumes from its last checkpoint: it trains only steps 9..16, and its draft LM equals an
    uninterrupted run's."""
    import csv
    import json

    from safetensors.torch import load_file

    from draftsmith.families.xvocab.module import XVocabModule
    from draftsmith.families.xvocab.train import distill_across_vocab

    def run(out):
        return distill_across_vocab(hybrid["draft"], hybrid["target"], hybrid["data"], out, steps=16, batch_size=8,
                                    lr=3e-3, token_weight=1.0)  # fmt: skip

    reference = run(tmp_path / "reference")

    def interrupt(module, outputs, batch, batch_idx):
        if module.global_step == 10:
            raise RuntimeError("interrupted")

    monkeypatch.setattr(XVocabModule, "on_train_batch_end", interrupt)
    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "resumed")
    monkeypatch.undo()
    capsys.readouterr()
    resumed = run(tmp_path / "resumed")
    assert "resuming from" in capsys.readouterr().out
    metrics = (resumed / "fit" / "csv" / "version_1" / "metrics.csv").read_text().splitlines()
    steps = [int(r["step"]) for r in csv.DictReader(metrics) if r.get("step")]
    assert steps and min(steps) >= 8  # the resumed run trained only the steps after its last checkpoint
    want, got = load_file(reference / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    records = [json.loads((d / "distill.json").read_text()) for d in (reference, resumed)]
    assert records[0]["step"] == records[1]["step"] and records[0]["loss_first"] == records[1]["loss_first"]
