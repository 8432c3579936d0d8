"""RASD: the retrieval indexes, and retrieval fused with a model drafter's tree (exact and lossless)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama
from test_architectures import ARCHITECTURES, build, hf_generate, sibling
from test_tree_drafting import eagle
from test_verifier import SMALL_V, depth_pvalues

from draftsmith.cli import main
from draftsmith.core import trees
from draftsmith.core.draft import Draft
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.data.generate import generate
from draftsmith.data.shards import load_generated
from draftsmith.errors import DraftsmithError
from draftsmith.eval.metrics import interpolate_ratio
from draftsmith.eval.rasd import choose_nodes
from draftsmith.eval.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.draft_lm.network import DraftLM
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.families.rasd import drafter as rasd
from draftsmith.families.rasd.drafter import RasdDrafter, fuse
from draftsmith.families.specs import Named, Rasd, load_drafter, parse_spec
from draftsmith.layers.retrieval import SEPARATOR, ContextIndex, SuffixIndex, select
from draftsmith.layers.tree_draft import TreePolicy

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


def rasd_triples(soft_pair, kind: str, n: int = 600) -> torch.Tensor:
    target, draft = soft_pair
    inner = DraftLM(draft)
    inner.tree = TreePolicy(TreeKind.parse(kind), size=4, top_k=2, branching=(2, 1))
    drafter = RasdDrafter(inner, nodes=4, prune_top_k=0)
    decoder, g = SpeculativeDecoder(target, drafter, 2, Sampling(temperature=1.0)), torch.Generator().manual_seed(5)
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
    bad_specs = ("rasd:nodes=0:target", "rasd:bogus=1:target", "rasd:context=yes:target", "rasd:datastore=:target")
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
        str(model_dirs["target"]),
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
    drafter = RasdDrafter(DraftLM(make_llama(seed=5, layers=1)), datastore=known)
    free, dear = {1: 1.0, 64: 1.0}, {1: 1.0, 5: 1.0, 6: 100.0, 64: 100.0}  # dear: free up to a chain's 5 tokens
    cheap = choose_nodes(target, drafter, prompt, 4, Sampling(), free, 1e3, budgets=(0, 4, 16), max_new_tokens=16)
    assert cheap.nodes > 0 and drafter.nodes == cheap.nodes
    by_nodes = {c["nodes"]: c for c in cheap.candidates}
    assert by_nodes[cheap.nodes]["tau"] > by_nodes[0]["tau"]
    assert by_nodes[0]["verified"] <= 5 < by_nodes[16]["verified"]  # the drafter alone: at most K = 4 + the root
    costly = choose_nodes(target, drafter, prompt, 4, Sampling(), dear, 1e3, budgets=(0, 4, 16), max_new_tokens=16)
    assert costly.nodes < cheap.nodes
    for c in costly.candidates:
        assert c["speedup"] == pytest.approx(c["tau"] / (interpolate_ratio(dear, c["verified"]) + c["cost"]))


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
