"""Tree drafting by feature drafters: EAGLE's tree attention drafts what its chain drafts, and
trees from Medusa heads stay exact (greedy) and lossless (sampling)."""

from __future__ import annotations

import torch
from test_trees import soft_target  # noqa: F401 - module fixture: a soft 8-token target
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution

from draftsmith.core.sampling import Sampling
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.network import EagleModel
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.layers.tree_draft import TreePolicy

PATHS = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0))


def eagle(target, version: int):
    torch.manual_seed(0)
    layers = (-1,) if version == 1 else (1, 2)
    cfg = EagleConfig.from_target(target.config, version, target._check_layers(layers), 0)
    model = EagleModel(cfg)
    model.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    return model.as_drafter()


def begin(target, drafter, prompt):
    out = target(torch.tensor([prompt]), feature_layers=drafter.feature_layers)
    first = int(out.logits[0, -1].argmax())
    return drafter.begin(torch.tensor(prompt + [first]), out.positions(slice(None)))


def test_eagle_static_tree_top1_path_is_its_greedy_chain(target, prompts):
    """Siblings share the tree step; if the tree mask or positions were wrong they would leak into the path."""
    for version in (1, 3):
        drafter = eagle(target, version)
        chain = drafter.propose(begin(target, drafter, prompts[1]), 4, Sampling(), None)
        drafter.tree = TreePolicy(TreeKind.STATIC, size=len(PATHS), paths=PATHS)
        tree = drafter.propose(begin(target, drafter, prompts[1]), 4, Sampling(), None)
        assert len(tree) == len(PATHS) and not tree.is_chain
        top1 = [tree.tokens[PATHS.index(p)].item() for p in ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))]
        assert top1 == chain.tokens.tolist()
        assert tree.tokens[PATHS.index((1,))] != tree.tokens[PATHS.index((0,))]


def test_eagle_dynamic_trees_decode_exactly_as_plain_greedy(target, prompts):
    drafter = eagle(target, 3)
    drafter.tree = TreePolicy(TreeKind.DYNAMIC, size=10, top_k=3)
    decoder = SpeculativeDecoder(target, drafter, 4, Sampling())
    for prompt in prompts:
        result = decoder.generate(prompt, 20)
        assert result.tokens == plain_decode(target, prompt, 20, Sampling()).tokens
        assert max(result.drafted) > 4  # trees, not chains


def test_medusa_dynamic_tree_sampling_is_distributed_as_the_target(soft_target):  # noqa: F811
    cfg = MedusaConfig(num_heads=2, hidden_size=soft_target.hidden_size, vocab_size=SMALL_V)
    model = MedusaModel(cfg)
    model.init_from_target(soft_target.lm_head.weight)
    drafter = model.as_drafter()
    drafter.tree = TreePolicy(TreeKind.DYNAMIC, size=5, top_k=2)
    sampling = Sampling(temperature=1.0)
    decoder = SpeculativeDecoder(soft_target, drafter, 2, sampling)
    counts, g, trees_seen = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7), 0
    for _ in range(1500):
        result = decoder.generate([1, 2, 3], 4, g)  # one depth-2 tree round
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
        trees_seen += result.drafted[0] > 2
    assert trees_seen == 1500
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) > 1e-3
