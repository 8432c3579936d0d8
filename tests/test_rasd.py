"""RASD: the retrieval indexes, and retrieval fused with a model drafter's tree (exact and lossless)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_llama
from test_architectures import ARCHITECTURES, build, hf_generate, sibling
from test_tree_drafting import eagle
from test_verifier import SMALL_V, chi_square_pvalue, depth_pvalues

from draftsmith.cli import main
from draftsmith.core import trees
from draftsmith.core.draft import Draft
from draftsmith.core.sampling import Sampling, sample
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.data.generate import generate
from draftsmith.data.shards import load_generated
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.families.rasd import drafter as rasd
from draftsmith.families.rasd.budget import choose_nodes
from draftsmith.families.rasd.drafter import RasdDrafter, fuse
from draftsmith.families.rasd.retrieval import SEPARATOR, ContextIndex, SuffixIndex, select
from draftsmith.families.specs import Named, Rasd, load_drafter, parse_spec
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.layers.tree_draft import TreePolicy
from draftsmith.targets import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")


def test_select_keeps_the_most_frequent_trie_nodes_as_paths():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]  # counts: (1) 3, (1, 2) 2, every other node 1
    assert select(conts, 2) == [[1, 2]]
    assert select(conts, 3) == [[1, 2, 3]]  # ties go to the earlier-listed continuation
    assert select(conts, 5) == [[1, 2, 3], [1, 2, 4], [1, 5]]
    assert select(conts, 100) == [[1, 2, 3], [1, 2, 4], [1, 5], [6]]


def test_context_index_returns_every_continuation_of_the_longest_matching_suffix():
    index = ContextIndex(max_ngram=3)
    index.extend([1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2])
    assert index.lookup(1, 4) == [[3], [4]]  # (1, 2) continued with 3 twice, 4 once: most frequent first
    assert index.lookup(2, 5) == [[3, 7], [4, 8], [3, 9]]  # latest first on ties
    assert index.lookup(2, 4) == [[3, 7], [4, 8]]  # (3), then count-1 nodes latest first: (3, 7), (4), (4, 8)
    index.extend([5, 7, 1, 2])  # now (7, 1, 2) occurred before, followed by 5: the longer suffix wins
    assert index.lookup(2, 4) == [[5, 7]]
    runs = ContextIndex(max_ngram=2)
    runs.extend([4, 4, 4])
    assert runs.lookup(3, 3) == [[4, 4, 4]]  # a match at the end runs on into what it drafts


def brute_force(docs: list[list[int]], context: list[int], length: int, max_ngram: int, order: int) -> set:
    """Every distinct continuation of the longest suffix (<= ``order``) of ``context`` found in ``docs``."""
    for n in range(min(max_ngram, order, len(context)), 0, -1):
        suffix = context[-n:]
        conts = {
            tuple(d[i + n : i + n + length]) for d in docs for i in range(len(d) - n + 1) if d[i : i + n] == suffix
        }
        conts.discard(())
        if conts:
            return {c for c in conts if not any(o != c and o[: len(c)] == c for o in conts)}  # the trie's leaves
    return set()


@pytest.mark.parametrize("order", [2, 3, 16])
def test_suffix_index_finds_every_continuation_a_scan_finds(order):
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, 5, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (12,), generator=g)]
    index = SuffixIndex.build(docs, order=order)
    assert len(index) == sum(len(d) + 1 for d in docs) and (index.tokens == SEPARATOR).sum() == len(docs)
    for _ in range(60):
        context = torch.randint(0, 5, (int(torch.randint(1, 6, (), generator=g)),), generator=g).tolist()
        found = index.lookup(context, 3, 1000, max_ngram=4)
        assert {tuple(p) for p in found} == brute_force(docs, context, 3, 4, order), context
    # the most frequent continuation comes first
    index = SuffixIndex.build([[1, 2, 3], [1, 2, 3], [1, 2, 4], [0, 1, 2, 5]])
    assert index.lookup([9, 1, 2], 1, 4, max_ngram=4) == [[3], [4], [5]]
    assert index.lookup([7, 7], 2, 4, max_ngram=4) == []


def test_fuse_merges_by_longest_prefix_with_distinct_siblings_and_point_masses():
    # the drafter's tree: root -> 5 -> 6, root -> 7; q rows for each node
    q = torch.softmax(torch.randn(3, SMALL_V), -1)
    draft = Draft(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, -1]), q)
    fused, retrieved = fuse(draft, [[5, 6, 1], [5, 2], [7], [3, 4]], budget=3)
    assert fused.tokens.tolist() == [5, 6, 7, 1, 2, 3] and fused.parents.tolist() == [-1, 0, -1, 1, 0, -1]
    assert retrieved == [False, False, False, True, True, True]  # budget 3: [3, 4] stops after 3
    assert torch.equal(fused.q[:3], q) and fused.q[3:].argmax(-1).tolist() == [1, 2, 3]
    assert torch.equal(fused.q[3:].sum(-1), torch.ones(3))
    # a deterministic tree stays q-less; repeated candidates count as one node
    fused, _ = fuse(Draft(torch.tensor([5, 5, 6]), torch.tensor([-1, -1, 1])), [[5, 6, 2]], budget=4)
    assert fused.q is None and fused.tokens.tolist() == [5, 5, 6, 2] and fused.parents.tolist() == [-1, -1, 1, 2]
    fused, _ = fuse(Draft(torch.tensor([5, 5, 6]), torch.tensor([-1, -1, 0])), [[5, 6, 2]], budget=4)
    assert fused.tokens.tolist() == [5, 5, 6, 2] and fused.parents.tolist() == [-1, -1, 0, 2]


def repetitive(seed: int, vocab: int = 90) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    motifs = [torch.randint(0, vocab, (5,), generator=g).tolist() for _ in range(3)]
    return [sum((motifs[(i + j) % 3] for j in range(4)), []) + motifs[i][:2] for i in range(2)]


def decode_all(target, drafter, k, prompts, budget, reference):
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    retrieved = accepted = 0
    for prompt in prompts:
        result = decoder.generate(prompt, budget)
        assert result.tokens == reference(prompt), prompt
        retrieved += drafter.stats["retrieved"]
        accepted += drafter.stats["accepted_retrieved"]
        assert drafter.stats["accepted"] == sum(result.accepted)
        drafter.extra_metrics([result])  # resets the counts
    return retrieved, accepted


def medusa(target):
    model = MedusaModel(MedusaConfig(num_heads=3, hidden_size=target.hidden_size, vocab_size=target.vocab_size))
    model.init_from_target(target.lm_head.weight)
    return model.as_drafter()


@pytest.mark.parametrize("policy", [TreePolicy(), TreePolicy(TreeKind.DYNAMIC, size=6, top_k=2)])
@pytest.mark.parametrize("family", ["eagle3", "medusa"])
def test_greedy_rasd_over_feature_drafters_equals_plain_greedy(target, policy, family):
    prompts = repetitive(0)
    known = [p + plain_decode(target, p, 10, Sampling()).tokens for p in prompts]  # how the first rounds go on
    inner = eagle(target, 3) if family == "eagle3" else medusa(target)
    drafter = RasdDrafter(inner, datastore=SuffixIndex.build(known), nodes=6)
    drafter.tree = policy
    retrieved, accepted = decode_all(
        target, drafter, 4, prompts, 23, lambda p: plain_decode(target, p, 23, Sampling()).tokens
    )
    assert retrieved > 0 and accepted > 0  # retrieval nodes were verified beside the model's, and accepted


def test_retrieval_goes_deeper_than_a_model_drafting_at_its_own_depth(target):
    """``depth=1``: the model drafts one token a round, retrieval's paths go on to K = 4 below it; greedy output
    stays plain greedy's, and rounds accept more than the model's one token (retrieval's deeper nodes)."""
    prompts = repetitive(0)
    known = [p + plain_decode(target, p, 10, Sampling()).tokens for p in prompts]
    drafter = RasdDrafter(eagle(target, 3), datastore=SuffixIndex.build(known), nodes=6, depth=1)
    asked, propose = [], drafter.inner.propose
    drafter.inner.propose = lambda state, k, *rest: asked.append(k) or propose(state, k, *rest)
    decoder, deep = SpeculativeDecoder(target, drafter, 4, Sampling()), 0
    for prompt in prompts:
        result = decoder.generate(prompt, 23)
        assert result.tokens == plain_decode(target, prompt, 23, Sampling()).tokens, prompt
        deep += sum(a > 1 for a in result.accepted)
    assert set(asked) == {1} and deep > 0


@pytest.mark.parametrize("name", ["qwen2_mixed", "gpt2"])
@pytest.mark.parametrize("kind", ["chain", "dynamic"])
def test_greedy_rasd_over_a_draft_lm_equals_generate(name, kind):
    model = build(ARCHITECTURES[name], seed=1)
    inner = DraftLM(sibling(model))
    inner.tree = TreePolicy(TreeKind.parse(kind), size=6, top_k=2)
    prompts = [p[:7] for p in repetitive(1)]
    datastore = SuffixIndex.build([p + hf_generate(model, p, 10) for p in prompts])  # how the first rounds go on
    drafter = RasdDrafter(inner, datastore=datastore, nodes=8, prune_top_k=0)
    retrieved, accepted = decode_all(
        Target(model, name=name), drafter, 4, prompts, 21, lambda p: hf_generate(model, p, 21)
    )
    assert retrieved > 0 and accepted > 0


SOFT_PROMPT = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 5, 4, 7, 6, 0]  # every token seen before: retrieval always proposes


@pytest.fixture(scope="module")
def soft_pair():
    """A soft 8-token target (every pair of tokens gets real mass) and a draft LM that disagrees with it."""
    target = Target(make_llama(seed=11, layers=1, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    return target, make_llama(seed=12, layers=1, hidden=32, vocab=SMALL_V)


def rasd_triples(soft_pair, kind: str, n: int = 600, rule: VerifyRule = VerifyRule.SPECINFER) -> torch.Tensor:
    target, draft = soft_pair
    inner = DraftLM(draft)
    policy = dict(size=4, top_k=2, branching=(2, 1), replacement=rule.replacement, beam_width=3)
    inner.tree = TreePolicy(TreeKind.parse(kind), **policy)
    drafter = RasdDrafter(inner, nodes=4, prune_top_k=0)
    decoder = SpeculativeDecoder(target, drafter, 2, Sampling(temperature=1.0), rule)
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(SMALL_V, SMALL_V, SMALL_V)  # (x1, x2, x3): x1 from the prefill, x2 and x3 one depth-2 round
    for _ in range(n):
        x1, x2, x3 = decoder.generate(SOFT_PROMPT, 4, g).tokens[:3]
        counts[x1, x2, x3] += 1
    assert drafter.stats["retrieved"] > n  # retrieval added nodes in most rounds
    return counts


@pytest.mark.parametrize("kind", ["chain", "sampled", "dynamic"])
def test_rasd_sampling_is_distributed_as_the_target(soft_pair, kind):
    """Model nodes with their q rows (chain, sampled tree) or deterministic (dynamic tree), retrieval nodes as point
    masses, in one tree: the first two verified depths are distributed as plain sampling."""
    triples = rasd_triples(soft_pair, kind)
    depth1, depth2 = depth_pvalues(soft_pair[0], SOFT_PROMPT, Sampling(temperature=1.0), triples)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


@pytest.mark.parametrize("kind", ["sampled", "beam"])
def test_rasd_over_rsd_trees_is_distributed_as_the_target(soft_pair, kind):
    """Retrieval fused into trees drawn without replacement (RSD-C) and into stochastic beams (RSD-S), verified by
    RSD: the retrieved point masses come after the drawn siblings, each of whose rows removes the ones before it."""
    triples = rasd_triples(soft_pair, kind, rule=VerifyRule.RSD)
    depth1, depth2 = depth_pvalues(soft_pair[0], SOFT_PROMPT, Sampling(temperature=1.0), triples)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


@pytest.mark.parametrize("kind", ["chain", "sampled"])
def test_chi_square_catches_a_merge_that_gives_retrieval_nodes_the_drafters_q(soft_pair, monkeypatch, kind):
    """A merge that treats the fused tree as the drafter's, giving each retrieval node the q row of the drafter's first
    node at its depth, accepts retrieved tokens with min(1, p/q) instead of p: biased at both verified depths, and the
    test must see it at each."""

    def broken(draft, paths, budget):
        fused, retrieved = fuse(draft, paths, budget)
        if fused.q is not None:
            depth = trees.depths(fused.parents)
            for i in (i for i, r in enumerate(retrieved) if r):
                model = [j for j in range(len(draft)) if depth[j] == depth[i]]
                if model:
                    fused.q[i] = fused.q[model[0]]
        return fused, retrieved

    monkeypatch.setattr(rasd, "fuse", broken)
    triples = rasd_triples(soft_pair, kind, 400)
    depth1, depth2 = depth_pvalues(soft_pair[0], SOFT_PROMPT, Sampling(temperature=1.0), triples)
    assert depth1 < 1e-3 and depth2 < 1e-3, (depth1, depth2)


@pytest.mark.parametrize("kind", ["chain", "sampled"])
def test_a_sampled_round_holds_the_models_nodes_with_their_q_rows_and_retrieval_point_masses(soft_pair, kind):
    """One fused round under sampling: the drafter's nodes first, as it drafts them alone from the same random stream,
    with its q rows; then the retrieved nodes, drawing nothing from the stream (a function of the context and the
    drafter's tree), each a one-hot q row on its token."""
    target, draft = soft_pair
    inner = DraftLM(draft)
    inner.tree = TreePolicy(TreeKind.parse(kind), branching=(2, 1))
    drafter, sampling = RasdDrafter(inner, nodes=4, prune_top_k=0), Sampling(temperature=1.0)
    out = target(torch.tensor([SOFT_PROMPT]))
    tokens, rows = torch.tensor([*SOFT_PROMPT, 3]), out.positions(slice(None))
    for seed in range(4):
        stream, own = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        alone = inner.propose(inner.begin(tokens, rows), 2, sampling, own)
        state = drafter.begin(tokens, rows)
        fused = drafter.propose(state, 2, sampling, stream)
        assert torch.equal(stream.get_state(), own.get_state())  # retrieval draws nothing
        n, (_, _, retrieved) = len(alone), state.last
        assert retrieved == [False] * n + [True] * (len(fused) - n) and len(fused) > n
        assert torch.equal(fused.tokens[:n], alone.tokens) and torch.equal(fused.parents[:n], alone.parents)
        assert torch.equal(fused.q[:n], alone.q) and (alone.q.max(-1).values < 1).all()  # the model's own rows
        assert torch.equal(fused.q[n:], torch.nn.functional.one_hot(fused.tokens[n:], SMALL_V).to(fused.q.dtype))
        # retrieval's nodes are a function of the context and the drafter's tree
        again, _ = fuse(alone, drafter.retrieve(drafter.begin(tokens, rows), 2), drafter.nodes)
        assert torch.equal(fused.tokens, again.tokens) and torch.equal(fused.parents, again.parents)


def test_rasd_specs_parse_and_build_in_one_line(target):
    assert parse_spec("rasd:runs/x/eagle3") == Named("rasd:runs/x/eagle3", Rasd("runs/x/eagle3"))
    named = parse_spec("fused=rasd:datastore=/data/store,nodes=8,prune=0,context=0:target")
    assert named == Named("fused", Rasd("target", "/data/store", False, 8, 4, 0))
    assert parse_spec("rasd:depth=2:target").spec == Rasd("target", depth=2)
    assert parse_spec("rasd:nodes=0:target").spec == Rasd("target", nodes=0)  # the model drafter alone
    bad_specs = ("rasd:bogus=1:target", "rasd:context=yes:target", "rasd:datastore=:target")
    for bad in (*bad_specs, "rasd:depth=0:target"):
        with pytest.raises(DraftsmithError, match="expected rasd:DRAFTER") as e:
            parse_spec(bad)
        assert "\n" not in str(e.value)
    drafter = load_drafter("rasd:nodes=3:target", target)
    assert isinstance(drafter, RasdDrafter) and isinstance(drafter.inner, DraftLM) and drafter.nodes == 3
    with pytest.raises(DraftsmithError, match="tree drafter"):
        load_drafter("rasd:ngram", target)
    with pytest.raises(DraftsmithError, match="no retrieval source"):
        load_drafter("rasd:context=0:target", target)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, model_dirs):
    """Greedy answers of the tiny target (``model_dirs``) to a few prompts, as ``draftsmith generate`` writes them."""
    root = tmp_path_factory.mktemp("rasd")
    (root / "prompts.jsonl").write_text("".join(f'{{"prompt": "w{i} w{i + 1} w{i + 2}"}}\n' for i in range(0, 30, 5)))
    generate(
        resolve_target(str(model_dirs["target"])),
        str(root / "prompts.jsonl"),
        root / "gen",
        temperature=0.0,
        max_new_tokens=16,
        device="cpu",
    )
    return root


def test_datastore_command_indexes_the_corpus_beside_it_and_rasd_retrieves_its_answers(corpus, model_dirs, capsys):
    main(["datastore", str(corpus / "gen"), "--order", "8"])
    printed = capsys.readouterr().out
    store = corpus / "gen.datastore"
    assert f"{store}: 6 rows" in printed and "built in" in printed
    dataset, meta = load_generated(corpus / "gen")
    index, info = SuffixIndex.load(store)
    assert info["fingerprint"] == meta["target"] and info["rows"] == 6 and info["build_seconds"] >= 0
    assert index.tokens.tolist() == sum(([*row, SEPARATOR] for row in dataset["input_ids"]), [])
    # the target's greedy answer to a corpus prompt is in the datastore: retrieval drafts it
    target = Target.from_pretrained(model_dirs["target"])
    drafter = load_drafter(f"rasd:datastore={store},context=0:target", target)
    drafter.inner = DraftLM(make_llama(seed=5, layers=1))  # a draft LM that mostly disagrees with the target
    prompt, answer = (
        dataset[0]["input_ids"][: dataset[0]["prompt_len"]],
        dataset[0]["input_ids"][dataset[0]["prompt_len"] :],
    )
    result = SpeculativeDecoder(target, drafter, 4, Sampling()).generate(prompt, len(answer))
    assert result.tokens == answer == plain_decode(target, prompt, len(answer), Sampling()).tokens
    assert drafter.extra_metrics([result])["accepted_from_retrieval"] > 0.5


def test_a_datastore_of_another_target_is_refused_in_one_line(corpus, model_dirs):
    main(["datastore", str(corpus / "gen"), "--out", str(corpus / "store")])
    other = Target.from_pretrained(model_dirs["drafter"])  # same tokenizer, another model
    with pytest.raises(DraftsmithError, match="datastore .* was made for target") as e:
        load_drafter(f"rasd:datastore={corpus / 'store'}:target", other)
    assert "\n" not in str(e.value)
    with pytest.raises(DraftsmithError, match="no datastore.json"):
        load_drafter(f"rasd:datastore={corpus}:target", other)


def test_retrieval_budget_is_chosen_from_the_cost_of_verifying_wider_trees(target):
    """Where verifying is free (r = 1 for any m) retrieval nodes that raise τ pay; where verifying more than the
    drafter's chain costs 100 decode steps they do not. A step of 1000 s makes the drafter's own time negligible."""
    prompt = repetitive(0)[0]
    known = SuffixIndex.build([prompt + plain_decode(target, prompt, 12, Sampling()).tokens])
    drafter = RasdDrafter(DraftLM(make_llama(seed=5, layers=1)), datastore=known, prune_top_k=0)  # budgets alone
    free, dear = {1: 1.0, 64: 1.0}, {1: 1.0, 5: 1.0, 6: 100.0, 64: 100.0}  # dear: free up to a chain's 5 tokens
    cheap = choose_nodes(target, drafter, prompt, 4, Sampling(), free, 1e3, budgets=(0, 4, 16), max_new_tokens=16)
    assert cheap.nodes > 0 and drafter.nodes == cheap.nodes
    by_nodes = {c["nodes"]: c for c in cheap.candidates}
    assert by_nodes[cheap.nodes]["tau"] > by_nodes[0]["tau"]
    assert by_nodes[0]["verified"] <= 5 < by_nodes[16]["verified"]  # the drafter alone: at most K = 4 + the root
    costly = choose_nodes(target, drafter, prompt, 4, Sampling(), dear, 1e3, budgets=(0, 4, 16), max_new_tokens=16)
    assert costly.nodes < cheap.nodes
    for choice, ratios in ((cheap, free), (costly, dear)):  # S = τ / (r(m) + C), C ~ 0 against a 1000 s step
        for c in choice.candidates:
            r = float(np.interp(c["verified"], sorted(ratios), [ratios[m] for m in sorted(ratios)]))
            assert 0 <= c["cost"] < 1e-3 and c["speedup"] == pytest.approx(c["tau"] / r, rel=1e-3)
    assert max(c["speedup"] for c in costly.candidates if c["verified"] > 6) < 0.05  # r = 100 past 6 tokens


def test_spectr_refuses_a_round_with_retrieval_siblings_in_one_line(soft_pair):
    """K-SEQ needs a node's candidates i.i.d. from one distribution; a retrieved sibling is not one of them."""
    target, draft = soft_pair
    inner = DraftLM(draft)
    inner.tree = TreePolicy(TreeKind.SAMPLED, branching=(2, 1))
    decoder = SpeculativeDecoder(target, RasdDrafter(inner, prune_top_k=0), 2, Sampling(1.0), VerifyRule.SPECTR)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(DraftsmithError, match="--verify spectr needs each node's candidates drawn i.i.d.") as e:
        for _ in range(50):
            decoder.generate(SOFT_PROMPT, 4, g)
    assert "\n" not in str(e.value)


def test_pruning_reads_the_drafters_own_first_token_logits(target):
    """Paths survive when their first token is in the drafter's top-k first tokens, read from the logits its own
    propose computed: those of the draft model's forward on the committed tokens."""
    model = make_llama(seed=5, layers=1)
    inner = DraftLM(model)
    inner.tree = TreePolicy(TreeKind.DYNAMIC, size=4, top_k=2)
    drafter = RasdDrafter(inner, nodes=8, prune_top_k=2)
    first = torch.tensor([0.0, 3.0, 1.0, 2.0])
    assert drafter.prune([[1, 5], [2], [3, 0], [0]], first) == [[1, 5], [3, 0]]
    seen, prune = [], drafter.prune

    def recording(paths, logits):
        seen.append((list(state.context.ids), logits))
        return prune(paths, logits)

    drafter.prune = recording
    prompt = repetitive(0)[0]
    out = target(torch.tensor([prompt]))
    state = drafter.begin(torch.tensor(prompt + [int(out.logits[0, -1].argmax())]), out.positions(slice(None)))
    drafter.propose(state, 4, Sampling(), None)
    ((ids, logits),) = seen
    assert torch.allclose(logits, model(torch.tensor([ids])).logits[0, -1], atol=1e-5)


# --- repeated candidates that agree with retrieval (a sampled tree under sampling) ---------------------------------
# The rows of the counter-example (vocabulary 4): the target after x = 2, and the drafter's row there.
P_AFTER_X = torch.tensor([0.001, 0.454, 0.545, 0.0])
Q_AFTER_X = torch.tensor([0.182, 0.054, 0.346, 0.418])


def bigram_llama(transitions: torch.Tensor) -> torch.nn.Module:
    """A real one-layer Llama whose next-token distribution depends only on the last token: ``transitions[a]`` (V,)
    after token a. Attention and MLP write nothing to the residual stream, the embedding of token a is a one-hot
    direction, and the LM head reads the transition's logits from it (RMSNorm scales a one-hot row by sqrt(hidden))."""
    vocab = transitions.shape[0]
    model = make_llama(seed=0, layers=1, hidden=32, vocab=vocab)
    logits = transitions.clamp_min(1e-9).log()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, :vocab] = logits.T / 32**0.5
    return model.eval()


def repeat_pair() -> tuple[Target, DraftLM, list[int]]:
    """A target and a drafter (both bigram Llamas over 8 tokens) and a prompt for which retrieval from the context
    proposes [2, 2] after the first sampled token (mostly 4), while the drafter draws 2 more than once at depth 1: its
    copies' children, drawn from its row after 2 (``Q_AFTER_X``), miss the target's likely 2 in about half the rounds,
    so retrieval adds a node beside them."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.softmax(torch.randn(2, SMALL_V, SMALL_V, generator=g) * 0.5, -1)
    p[5] = torch.tensor([0.01, 0.01, 0.01, 0.01, 0.93, 0.01, 0.01, 0.01])  # the prompt's last token: x1 is mostly 4
    p[4] = torch.tensor([0.05, 0.1, 0.55, 0.1, 0.05, 0.05, 0.05, 0.05])  # then 2 is likely ...
    q[4] = torch.tensor([0.04, 0.04, 0.7, 0.04, 0.04, 0.04, 0.06, 0.04])  # ... and the drafter draws it repeatedly
    p[2], q[2] = torch.zeros(2, SMALL_V)
    p[2, :4], q[2, :4] = P_AFTER_X, Q_AFTER_X
    p[2] = (p[2] + 1e-3) / (p[2] + 1e-3).sum()
    q[2] = (q[2] + 1e-3) / (q[2] + 1e-3).sum()
    return Target(bigram_llama(p)), DraftLM(bigram_llama(q)), [5, 4, 2, 2, 6, 7, 5]


def test_a_bigram_llama_samples_from_its_transition_rows():
    rows = torch.softmax(torch.randn(SMALL_V, SMALL_V), -1)
    model = bigram_llama(rows)
    out = torch.softmax(model(torch.tensor([[3, 1, 4, 1, 5]])).logits[0], -1)
    assert torch.allclose(out, rows[[3, 1, 4, 1, 5]], atol=1e-5)


def fused_round_pairs(n: int, copies: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of (x1, x2) over ``n`` rounds of the project's ``fuse`` and ``trees.verify_tree_sampling`` alone:
    ``copies`` root candidates drawn i.i.d. from a drafter row q1 that favours 2, each with one child drawn from the
    drafter's row after its token (after 2: ``Q_AFTER_X``), and the retrieval path [2, 2] fused in. Where the round
    accepts nothing at depth 2, x2 is drawn from the target's row, as plain decoding's next step would. Returns the
    counts and plain sampling's probabilities, both (4, 4)."""
    vocab, g = 4, torch.Generator().manual_seed(seed)
    p1, q1 = torch.tensor([0.15, 0.15, 0.55, 0.15]), torch.tensor([0.1, 0.1, 0.7, 0.1])
    p2 = torch.stack([torch.tensor([0.4, 0.2, 0.3, 0.1]), torch.tensor([0.1, 0.1, 0.4, 0.4]), P_AFTER_X])
    p2 = torch.cat([p2, torch.tensor([[0.25, 0.25, 0.25, 0.25]])])
    q2 = torch.stack([torch.tensor([0.3, 0.3, 0.2, 0.2]), torch.tensor([0.4, 0.1, 0.1, 0.4]), Q_AFTER_X])
    q2 = torch.cat([q2, torch.tensor([[0.1, 0.2, 0.3, 0.4]])])
    counts = torch.zeros(vocab, vocab)
    for _ in range(n):
        first = [sample(q1, g) for _ in range(copies)]
        second = [sample(q2[t], g) for t in first]
        draft = Draft(
            torch.tensor(first + second),
            torch.tensor([-1] * copies + list(range(copies))),
            torch.stack([q1] * copies + [q2[t] for t in first]),
        )
        fused, _ = fuse(draft, [[2, 2]], budget=2)
        tokens, parents = fused.tokens.tolist(), fused.parents
        depth = trees.depths(parents).tolist()
        p = torch.stack(
            [p1] + [p2[t] if d == 1 else torch.full((vocab,), 0.25) for t, d in zip(tokens, depth, strict=True)]
        )
        path, nxt = trees.verify_tree_sampling(p, fused.q, tokens, parents, g)
        drawn = [tokens[i] for i in path] + [nxt]
        x1 = drawn[0]
        x2 = drawn[1] if len(drawn) > 1 else sample(p2[x1], g)
        counts[x1, x2] += 1
    return counts, p1[:, None] * p2


def fused_pvalues(n: int, copies: int = 3, seed: int = 0) -> tuple[float, float]:
    counts, expected = fused_round_pairs(n, copies, seed)
    return chi_square_pvalue(counts.sum(1), expected.sum(1)), chi_square_pvalue(counts.flatten(), expected.flatten())


def test_a_fused_sampled_tree_whose_repeated_candidates_agree_with_retrieval_is_lossless():
    """Root candidates 2, 2, ... drawn i.i.d. and a retrieved child of 2 added only where no copy drew it: the
    retrieved child is tried after every copy's own children (its presence depends on all their draws), so each
    copy's child is verified with the row it was really drawn from, at depth 1 and depth 2 alike."""
    depth1, depth2 = fused_pvalues(6000)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_chi_square_catches_a_walk_that_tries_the_retrieved_child_before_later_copies_children(monkeypatch):
    """The order of the bug: the first copy's children, the retrieved child hung under it, then the later copies'
    children, whose draws are then conditioned on missing the retrieved token yet verified with their q rows."""
    monkeypatch.setattr(trees.Walk, "candidates", lambda w: [c for m in w.members for c in w.kids.get(m, [])])
    _, depth2 = fused_pvalues(6000)
    assert depth2 < 1e-3, depth2


@pytest.mark.parametrize("broken", [False, True])
def test_rasd_over_a_sampled_tree_with_repeats_that_agree_with_retrieval_is_lossless(monkeypatch, broken):
    """End to end: ``SpeculativeDecoder`` with ``RasdDrafter`` over a draft LM's sampled (4, 1) tree, the drafter
    drawing the context's next token 2 more than once; chi-square at both verified depths (and, with the walk order of
    the bug, the test sees it)."""
    if broken:
        monkeypatch.setattr(trees.Walk, "candidates", lambda w: [c for m in w.members for c in w.kids.get(m, [])])
    target, inner, prompt = repeat_pair()
    inner.tree = TreePolicy(TreeKind.SAMPLED, branching=(4, 1))
    drafter = RasdDrafter(inner, nodes=4, prune_top_k=0)
    decoder, g = SpeculativeDecoder(target, drafter, 2, Sampling(temperature=1.0)), torch.Generator().manual_seed(7)
    triples = torch.zeros(SMALL_V, SMALL_V, SMALL_V)
    for _ in range(3000):
        x1, x2, x3 = decoder.generate(prompt, 4, g).tokens[:3]
        triples[x1, x2, x3] += 1
    assert drafter.stats["retrieved"] > 1000
    depth1, depth2 = depth_pvalues(target, prompt, Sampling(temperature=1.0), triples)
    # depth 2 where the repeats and retrieval meet: x3 after (x1, x2) = (4, 2), against the target's row after 2
    with torch.no_grad():
        after_x = torch.softmax(target.model(torch.tensor([[2]])).logits[0, -1], -1)
    where_they_meet = chi_square_pvalue(triples[4, 2], after_x)
    if broken:
        assert where_they_meet < 1e-3, where_they_meet
    else:
        assert depth1 > 1e-3 and depth2 > 1e-3 and where_they_meet > 1e-3, (depth1, depth2, where_they_meet)


def recorded_first(drafter: RasdDrafter, state, k: int = 4) -> torch.Tensor | None:
    """The first-token logits ``drafter.propose`` hands its pruning (greedy), recorded as the pruning sees them."""
    seen, prune = [], drafter.prune

    def recording(paths, first):
        seen.append(first)
        return prune(paths, first)

    drafter.prune = recording
    drafter.propose(state, k, Sampling(), None)
    (first,) = seen
    return first


def test_pruning_ranks_a_draft_lm_chains_first_token_by_its_logits(target):
    """A draft LM's greedy chain (its default shape) reports no q rows; pruning still reads its first-token logits,
    the draft model's own forward on the committed tokens (before, it read nothing and kept every path)."""
    model = make_llama(seed=5, layers=1)
    drafter = RasdDrafter(DraftLM(model), nodes=8, prune_top_k=8)
    prompt = repetitive(0)[0]
    out = target(torch.tensor([prompt]))
    ids = prompt + [int(out.logits[0, -1].argmax())]
    first = recorded_first(drafter, drafter.begin(torch.tensor(ids), out.positions(slice(None))))
    assert first is not None
    assert torch.allclose(first, model(torch.tensor([ids])).logits[0, -1], atol=1e-5)


def test_pruning_ranks_a_dspark_chains_first_token_by_its_logits_not_its_one_hot_q(tokenizer):
    """DSpark's greedy chain reports one-hot q rows: its first token's ranking is its block's first logits (as the
    training forward computes them), so the top 8 are the 8 most likely tokens, not the argmax and 7 arbitrary ids."""
    from test_dspark import CONTEXT
    from test_dspark import build as build_dspark

    base = make_llama(seed=0)
    net = build_dspark(base)
    target = Target(base, tokenizer, net.cfg.feature_layers)
    ids = torch.tensor([CONTEXT])
    out = target(ids)
    logits, _ = (
        x[0] for x in net.forward_heads(ids, out.features, torch.ones_like(ids), torch.arange(len(CONTEXT) - 1))
    )
    anchor = 5
    drafter = RasdDrafter(net.as_drafter(), nodes=8, prune_top_k=8)
    state = drafter.begin(torch.tensor(CONTEXT[: anchor + 2]), out.positions(slice(0, anchor + 1)))
    first = recorded_first(drafter, state)
    torch.testing.assert_close(first, logits[anchor, 0], atol=1e-5, rtol=1e-4)
    top8 = set(logits[anchor, 0].topk(8).indices.tolist())
    assert drafter.prune([[t] for t in range(base.config.vocab_size)], first) == [[t] for t in sorted(top8)]
