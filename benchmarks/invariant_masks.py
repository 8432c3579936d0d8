"""What building ``invariant_attention``'s masks once per forward saves, against building them in every layer.

    python benchmarks/invariant_masks.py [--device cpu|cuda] [--sha GIT_SHA]

Every layer of a forward passes ``invariant_attention`` the same mask over the same cache, so since 31c15d2 it
builds its groups' additive masks once per forward (``core.numerics``); before, each of SmolLM2's 30
layers built them again (about eight small ops a layer). On a launch-bound GPU step those ops count. This times,
interleaved on one model, the decode step and r(m) (a forward of m new tokens over a step, 200 cached tokens) of a
bf16 model of SmolLM2's shapes (``gpu_numerics.smollm2_shaped``): the fast kernels (SDPA), the batch-invariant
mode, and the batch-invariant mode with its masks built in every layer, as before. The two batch-invariant rows
compute the same values (asserted). Writes ``benchmarks/results/invariant_masks_{device}.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
from common import machine, write
from gpu_numerics import cost_prompt, costs_table, measure_costs, smollm2_shaped
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from draftsmith.core import numerics
from draftsmith.core.target import Target

PER_LAYER = "invariant_masks_per_layer"


def per_layer_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``invariant_attention`` building its masks in every call, as it did before 31c15d2."""
    numerics.forget_masks(module)
    return numerics.invariant_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved runs; each row is their median")
    parser.add_argument("--sha", default=None, help="the git SHA to record (a copied tree has no .git)")
    args = parser.parse_args()
    AttentionInterface.register(PER_LAYER, per_layer_attention)
    AttentionMaskInterface.register(PER_LAYER, eager_mask)
    model = smollm2_shaped()
    targets = {
        "fast (sdpa)": Target(copy.deepcopy(model).to(args.device), name="smollm2-shaped", batch_invariant=False),
        "batch-invariant, masks built once a forward": Target(
            copy.deepcopy(model).to(args.device), name="smollm2-shaped", batch_invariant=True
        ),
        "batch-invariant, masks built in every layer": Target(
            model.to(args.device), name="smollm2-shaped", batch_invariant=True
        ),
    }
    targets["batch-invariant, masks built in every layer"].model.set_attn_implementation(PER_LAYER)
    prompt = cost_prompt(model.config.vocab_size)
    once, every = list(targets.values())[1:]
    ids = torch.tensor([prompt])
    assert torch.equal(once(ids, once.new_cache()).logits, every(ids, every.new_cache()).logits)
    record = machine() | ({"git": args.sha} if args.sha else {})
    load = os.getloadavg()[0]
    data = {"machine": record, "device": args.device, "costs": measure_costs(targets, prompt, args.rounds)}
    data["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    if args.device.startswith("cuda"):
        data["gpu"] = torch.cuda.get_device_name()
    m = data["machine"]
    lines = [
        "# invariant_attention: masks built once a forward, or in every layer",
        "",
        f"`{m['command']}` · git {m['git']} · {m['date']} · {data.get('gpu') or m.get('cpu', '')} · "
        f"torch {m['torch']} · {m['threads']} threads · load average before / after {data['load'][0]} / "
        f"{data['load'][1]}",
        "",
        f"A bf16 model of SmolLM2's shapes (30 layers, random weights), 200 cached tokens, medians of {args.rounds} "
        "interleaved runs; r(m) = forward of m new tokens / one-token step.",
        "",
        *costs_table(data["costs"]),
    ]
    write(f"invariant_masks_{args.device.split(':')[0]}", data, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
