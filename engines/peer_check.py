"""Check exports with the peers' own code: the same target features and tokens through draftsmith's drafter and
through the peer's model class loading the export (``peer_forward.py`` in the peer's venv, ``peer_venv.sh``).

Which export each peer loads: ``speculators`` the speculators export (``Eagle3DraftModel``), ``specforge`` the SGLang
export (``LlamaForCausalLMEagle3``, the draft class SpecForge trains and writes for SGLang).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SETUP = Path(__file__).with_name("peer_venv.sh")
FORWARD = Path(__file__).with_name("peer_forward.py")
FORMATS = {"speculators": "speculators", "specforge": "sglang"}
"""Peer -> the export format its code loads."""


def ensure_venv(peer: str, venv: Path) -> tuple[Path | None, str]:
    """Build (once) the peer's venv; (its python, "") or (None, why it failed)."""
    proc = subprocess.run(["bash", str(SETUP), peer, str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        return None, f"{SETUP.name} {peer} failed (exit {proc.returncode}): {tail}"
    return venv / "bin" / "python", ""


@dataclass(frozen=True)
class StepLogits:
    """Per training-time-test step j, the draft-vocabulary logits (1, T, Vd), and the draft -> target id offsets."""

    logits: list[torch.Tensor]
    d2t: torch.Tensor
    confidence: list[torch.Tensor] | None = None
    """DSpark: per mask, the confidence head's logits (1, T')."""

    def target_tokens(self) -> list[torch.Tensor]:
        """Per step, the target id of each position's most likely draft token (through ``d2t``)."""
        out = []
        for step in self.logits:
            best = step.argmax(-1)
            out.append(best + self.d2t[best])
        return out


def draftsmith_logits(network, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], steps: int) -> StepLogits:
    """draftsmith's EAGLE-3 network over the same inputs (see ``peer_forward.py`` for the convention)."""
    with torch.no_grad():
        outs = network(input_ids, features, steps, None)
        return StepLogits([network.logits(h).float() for h in outs], network.d2t.detach().cpu().long())


def draftsmith_parallel_logits(network, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], depth: int):
    """draftsmith's P-EAGLE network over every anchor's placeholder chain (``peer_forward.py``'s P-EAGLE convention):
    per depth d, the (1, T - d, Vd) logits of placeholder d of anchors 0..T-1-d (depth 0: the anchors)."""
    from draftsmith.layers.parallel import parallel_layout

    t = input_ids.shape[1]
    anchors = [torch.arange(t - d) for d in range(1, depth)]
    layout = parallel_layout(torch.ones(1, t), anchors, last_real=0)
    with torch.no_grad():
        out = network.logits(network.parallel(input_ids, features, layout)).float()
    return StepLogits(list(out.split([t, *map(len, anchors)], dim=1)), network.d2t.detach().cpu().long())


def draftsmith_dflash_logits(network, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], depth: int):
    """draftsmith's DFlash network with a block at every anchor whose block fits (``peer_forward.py``'s DFlash
    convention): per mask d, the (1, T - K - 1, V) logits of anchors 0..T-K-2; full vocabulary (``d2t`` zeros)."""
    t = input_ids.shape[1]
    with torch.no_grad():
        out = network(input_ids, features, torch.ones_like(input_ids), torch.arange(t - depth - 1)).float()
    return StepLogits([out[:, :, d] for d in range(depth)], torch.zeros(out.shape[-1], dtype=torch.long))


def draftsmith_dspark_logits(network, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], depth: int):
    """draftsmith's DSpark network as ``draftsmith_dflash_logits``, the Markov bias of each mask's true previous token
    in its logits, and the confidence head's logits per mask."""
    t = input_ids.shape[1]
    with torch.no_grad():
        logits, conf = network.forward_heads(
            input_ids, features, torch.ones_like(input_ids), torch.arange(t - depth - 1)
        )
    d2t = torch.zeros(logits.shape[-1], dtype=torch.long)
    return StepLogits(
        [logits[:, :, d].float() for d in range(depth)], d2t, [conf[:, :, d].float() for d in range(depth)]
    )


def run_peer(python: Path, args: list[str], log: Path) -> None:
    """``peer_forward.py ARGS`` in the peer's venv; raises with the log's tail when it fails."""
    with log.open("w") as f:
        proc = subprocess.run(  # -P: not this folder first on sys.path (its speculators.py would shadow the peer)
            [str(python), "-P", str(FORWARD), *args], cwd=log.parent, stdout=f, stderr=f
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise RuntimeError(f"{args[0]} failed (exit {proc.returncode}); log {log}:\n{tail}")


def peer_checkpoint(python: Path, peer: str, target: Path, out: Path) -> Path:
    """A randomly initialised EAGLE-3 for ``target`` written by the peer's own code (``peer_forward.py write``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    run_peer(python, [peer, "write", str(out), str(target)], out.parent / f"{peer}-write.log")
    return out


def faulted_copy(src: Path, out: Path, config=None, tensors=None) -> Path:
    """A copy of the checkpoint dir ``src`` (``config.json`` and safetensors, as the peer wrote them) with one fault
    injected: ``config`` edits the config dict in place, ``tensors`` the dict of one ``.safetensors`` file's
    tensors (``draftsmith doctor``'s engine tests)."""
    out.mkdir(parents=True)
    for path in Path(src).iterdir():
        if path.name == "config.json" or path.suffix == ".safetensors":
            shutil.copy2(path, out / path.name)
    if config is not None:
        edited = json.loads((out / "config.json").read_text())
        config(edited)
        (out / "config.json").write_text(json.dumps(edited, indent=2))
    if tensors is not None:
        for path in sorted(out.glob("*.safetensors")):
            state = load_file(path)
            tensors(state)
            save_file(state, path, metadata={"format": "pt"})
    return out


def peer_logits(
    python: Path,
    peer: str,
    export: Path,
    input_ids: torch.Tensor,
    features: torch.Tensor,
    steps: int,
    work: Path,
    target: Path | None = None,
) -> StepLogits:
    """The peer's model class over the same inputs; raises with the peer's traceback when it fails to load or run.
    ``target``: for a drafter that ships no embedding or LM head and whose peer class is given them (SpecForge's
    DFlash)."""
    result = peer_logits_many(python, peer, {"run": export}, input_ids, features, steps, work, target)["run"]
    if isinstance(result, str):
        raise RuntimeError(f"{peer} refused {export}:\n{result}")
    return result


def peer_logits_many(
    python: Path,
    peer: str,
    exports: dict[str, Path],
    input_ids: torch.Tensor,
    features: torch.Tensor,
    steps: int,
    work: Path,
    target: Path | None = None,
) -> dict[str, StepLogits | str]:
    """``peer_logits`` for several exports in one process of the peer's venv (its imports take longer than the
    forwards): per name, the logits, or the tail of the traceback where the peer refused that export."""
    work.mkdir(parents=True, exist_ok=True)
    save_file(
        {"input_ids": input_ids.contiguous(), "features": features.float().contiguous(), "steps": torch.tensor(steps)},
        work / "inputs.safetensors",
    )
    jobs = {"inputs": "inputs.safetensors", "target": str(target) if target else None}
    jobs["runs"] = {name: str(path) for name, path in exports.items()}
    (work / "jobs.json").write_text(json.dumps(jobs))
    for name in exports:  # no result of an earlier run taken for this one's
        for stale in (work / f"{name}.error", work / f"{name}.safetensors"):
            stale.unlink(missing_ok=True)
    run_peer(python, [peer, "jobs.json"], work / f"{peer}.log")
    out = {}
    for name in exports:
        error = work / f"{name}.error"
        if error.is_file():
            out[name] = "\n".join(error.read_text().strip().splitlines()[-3:])
            continue
        tensors = load_file(work / f"{name}.safetensors")
        confidence = [tensors[f"confidence.{j}"] for j in range(steps)] if "confidence.0" in tensors else None
        out[name] = StepLogits([tensors[f"logits.{j}"] for j in range(steps)], tensors["d2t"].long(), confidence)
    return out
