"""Served speed: each servable drafter of a target in vLLM against vLLM without speculation, batch by batch.

    .venv/bin/python benchmarks/served.py --target smollm2 --drafter eagle3=CKPT --drafter eagle1=CKPT \
        --drafter peagle=CKPT --drafter dflash=CKPT --drafter medusa=CKPT --drafter draft-lm=CKPT \
        [--score chat-heldout=runs/score/report.json] [--score mt-bench=benchmarks/results/scaling.json#BLOCK]
    .venv/bin/python benchmarks/served.py --quick ...   # the mechanics: 2 prompts x 8 tokens, batch 1, one drafter

Each drafter (``NAME=SPEC``: a trained ``.ckpt`` or native dir, exported here with ``draftsmith export`` in the
format vLLM serves it in; an existing export dir, served as its manifest's command says; a HF draft-LM dir; or
``ngram[:N]``, vLLM's own prompt lookup, always included) is served by vLLM (its CPU build, in ``.venv-vllm``,
through ``data/vllm_worker.py``), greedy, K fixed, on the same prompts (``--sets``: MT-bench and chat-heldout,
``--prompts`` x ``--new-tokens``, stopping at EOS), at each ``--batches`` size: ``b`` prompts submitted together.
One cell is (drafter, set, batch): its prompts go in chunks of ``b``, the plain engine and the drafter's engine
alternating chunk by chunk (ABBA), so machine load weighs on both alike; the plain engine stays up for the whole
run, each drafter's for its cells. Each cell is saved under ``--out`` as it finishes and reused on a rerun with the
same inputs. Reported per cell: output tokens/s of each, the speedup, time per output token (vLLM's per-row time
from first to last token / (tokens - 1)), vLLM's spec-decode counters (mean acceptance length = 1 + accepted /
drafts) and how many outputs equal plain's; beside them the verifier's τ of a drafter of the same name, where a
``--score`` JSON (``draftsmith score``'s report.json, or a benchmark's ``FILE.json#BLOCK``) holds one for that set.
Writes ``benchmarks/results/NAME.{json,md}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
from pathlib import Path

from common import RESULTS, Load, machine, mtbench_subset, write
from served_report import markdown, summary

SETS = "builtin:mt-bench,builtin:chat-heldout"
BATCHES = "1,4,16"
WARMUP_TOKENS = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked (one line naming the argument, exit 2) before any model loads."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.families.specs import DraftModel, NGram, Trained, parse_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2", help="default, smollm2 or a local HF dir")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="auto: bfloat16 where the CPU multiplies it natively, else float32")  # fmt: skip
    parser.add_argument("--drafter", action="append", default=[], help="NAME=SPEC (repeatable)")
    parser.add_argument("--ngram", type=int, default=3, help="N of the n-gram always served (vLLM prompt_lookup_max)")
    parser.add_argument("--sets", default=SETS, help="comma-separated prompt sources (builtin:NAME or JSONL files)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per set")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default=BATCHES, help="comma-separated batch sizes")
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per step (Medusa / parallel: at most theirs)")
    parser.add_argument("--score", action="append", default=[], help="SET=REPORT.json or SET=RESULTS.json#BLOCK")
    parser.add_argument("--out", type=Path, default=Path("runs/served"), help="work dir: exports, cells, vLLM logs")
    parser.add_argument("--name", default="served", help="results name")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where NAME.json and NAME.md go")
    parser.add_argument("--eager", action="store_true", help="vLLM's enforce_eager (default: compiled, as served)")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine")
    parser.add_argument("--vllm-python", default=None, help="the vLLM venv's python (default .venv-vllm's)")
    parser.add_argument("--quick", action="store_true", help="2 prompts x 8 tokens, batch 1, first set and drafter")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.batches, args.eager = 2, 8, "1", True
    try:
        args.batches = sorted({int(b) for b in args.batches.split(",")})
    except ValueError:
        parser.error(f"--batches: expected comma-separated positive integers, got {args.batches!r}")
    for name, value in [("--batches", min(args.batches)), ("--prompts", args.prompts), ("--k", args.k),
                        ("--new-tokens", args.new_tokens), ("--ngram", args.ngram), ("--kv-cache-gib", args.kv_cache_gib)]:  # fmt: skip
        if value < 1:
            parser.error(f"{name} must be positive, got {value}")
    args.sets = [s for s in args.sets.split(",") if s]
    for source in args.sets:
        if not source.startswith("builtin:") and not Path(source).is_file():
            parser.error(f"--sets {source}: no such prompt file (or builtin:NAME)")
    drafters = [parse_spec(f"ngram=ngram:{args.ngram}")]
    for text in args.drafter:
        try:
            named = parse_spec(text)
        except DraftsmithError as e:
            parser.error(f"--drafter {text}: {e}")
        if isinstance(named.spec, NGram):
            drafters[0] = named
        elif not isinstance(named.spec, Trained | DraftModel):
            parser.error(f"--drafter {text}: vLLM serves trained drafters, draft LMs and the n-gram, not this one")
        elif not Path(named.spec.path).exists():
            parser.error(f"--drafter {named.name}: no such path {named.spec.path}")
        else:
            drafters.append(named)
    names = [d.name for d in drafters]
    if "plain" in names or len(set(names)) < len(names):
        parser.error(f"--drafter: names must be distinct and not 'plain', got {', '.join(names)}")
    args.drafters = drafters[:1] if args.quick else drafters
    labels = [set_label(s) for s in (args.sets[:1] if args.quick else args.sets)]
    args.sets = dict(zip(labels, args.sets, strict=False))
    args.scores = []
    for text in args.score:
        label, eq, path = text.partition("=")
        if not eq or label not in args.sets or not Path(path.partition("#")[0]).is_file():
            parser.error(f"--score {text}: expected SET=FILE.json[#BLOCK], SET one of {', '.join(args.sets)}")
        args.scores.append((label, path))
    return args


def set_label(source: str) -> str:
    """A prompt set's name in the report: ``builtin:NAME`` -> NAME, a file -> its stem."""
    return source.removeprefix("builtin:") if source.startswith("builtin:") else Path(source).stem


def load_set(source: str, n: int) -> list:
    """``n`` prompts of ``source``; MT-bench's are taken evenly from its 8 categories."""
    from draftsmith.data.prompts import MTBENCH, load_prompts

    return mtbench_subset(n)[:n] if source == MTBENCH else load_prompts(source, limit=n)


def ids_hash(prompts: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]


def cell_path(out: Path, drafter: str, label: str, batch: int) -> Path:
    return out / "cells" / f"{drafter}__{label}__b{batch}.json"


def load_cell(path: Path, key: dict) -> dict | None:
    """The saved cell at ``path`` if it was measured with exactly ``key``'s inputs, else None."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return saved if saved.get("key") == key else None


def save_cell(path: Path, cell: dict) -> None:
    """Write ``cell`` whole or not at all (a killed run leaves no half cell)."""
    from draftsmith.core.files import write_whole

    write_whole(path, json.dumps(cell, indent=1))


def installed_vllm(python: Path) -> str | None:
    """The vLLM version installed for ``python`` (its package metadata: no vLLM import), None where unknown."""
    import subprocess

    code = "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n try: print(m.version(d)); break\n except m.PackageNotFoundError: pass"
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return run.stdout.strip() or None


def earlier_report(path: Path, here: dict, inputs: dict, args: dict) -> dict | None:
    """The report ``path`` (results/NAME.json) if an earlier run wrote it on this machine (the same CPU and flags,
    threads, torch) with the same ``inputs`` (target fingerprint, dtype, vLLM) and ``args`` (K, prompts, tokens),
    else None: only such a report's cells are comparable with this run's."""
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    same_machine = all(result["machine"].get(k) == here.get(k) for k in ("cpu", "cpu_flags", "threads", "torch"))
    same_args = all(result["args"].get(k) == v for k, v in args.items())
    if not (same_machine and same_args) or not same_inputs(result, inputs):
        return None
    return result


def same_inputs(result: dict, inputs: dict) -> bool:
    """Whether the report ``result`` was made from ``inputs``; of the target fingerprint the identity as
    ``identity_diff`` compares it (a config hash recorded before it left out the transformers version is the same
    target's), and the rest as recorded."""
    from draftsmith.core.fingerprint import identity_diff

    def rest(fingerprint: dict) -> dict:
        return {k: v for k, v in fingerprint.items() if k != "config_hash"}

    old, new = result.get("target") or {}, inputs.get("target") or {}
    same_target = not identity_diff(old, new) and rest(old) == rest(new)
    return same_target and all(result.get(k) == v for k, v in inputs.items() if k != "target")


def measured_by(result: dict, cell: dict) -> dict | None:
    """The git SHA and date that measured a cell of the report ``result``: its own record, else the report's run where
    that run measured it (``computed``), else None (unrecorded: a run that reused a cell is not its measurement)."""
    if cell.get("measured"):
        return cell["measured"]
    mine = cell_path(Path(), cell["drafter"], cell["set"], cell["batch"]).name in result.get("computed", [])
    return {"git": result["machine"]["git"], "date": result["machine"]["date"]} if mine else None


def earlier_cells(result: dict | None, drafters: dict, sets: dict) -> dict:
    """(drafter, set, batch) -> a cell of an earlier run's report ``result`` (``earlier_report``; None: none) with
    the same drafter config and prompt source, rebuilt as the cell file it was: such cells stand in for those a new
    workspace lost from ``--out/cells``, so that adding a drafter measures its own cells only. A cell saved with its
    key (from this version on) must match the new key too (``main``)."""
    if result is None:
        return {}
    return {
        (c["drafter"], c["set"], c["batch"]): {"key": c.get("key"), "vllm": c["vllm"], "chunks": c["chunks"],
                                               "counters": c["summary"]["counters"] or None,
                                               "measured": measured_by(result, c)}
        for c in result["cells"]
        if "chunks" in c and c["drafter"] in drafters and result["drafters"].get(c["drafter"]) == drafters[c["drafter"]]
        and c["set"] in sets and result["sets"].get(c["set"]) == sets[c["set"]]
    }  # fmt: skip


def other_drafters(result: dict | None, drafters: dict, sets: dict) -> tuple[dict, list, dict]:
    """What this run keeps of an earlier run's report ``result`` (``earlier_report``; None: none): the drafters it
    does not name, with their configs and their measured cells on this run's prompt sets (a run that adds a drafter
    keeps the rows whose drafter this workspace no longer holds), and the verifier scores of those and of the drafters
    it names with the same config."""
    if result is None:
        return {}, [], {}
    same_set = {s for s in sets if result["sets"].get(s) == sets[s]}
    cells = [c | {"measured": measured_by(result, c)} for c in result["cells"]
             if "chunks" in c and c["drafter"] not in drafters and c["set"] in same_set]  # fmt: skip
    others = {n: d for n, d in result["drafters"].items() if n in {c["drafter"] for c in cells}}
    same = set(others) | {n for n, d in drafters.items() if result["drafters"].get(n) == d}
    scores = {
        s: {n: v for n, v in by.items() if n in same} for s, by in result.get("scores", {}).items() if s in same_set
    }
    return others, cells, {s: by for s, by in scores.items() if by}


def side(reply: dict) -> dict:
    """One engine's chunk: its seconds, each row's tokens and vLLM's first-to-last-token seconds."""
    rows = reply["outputs"]
    return {"seconds": reply["seconds"], "tokens": [len(r["tokens"]) for r in rows],
            "token_seconds": [r.get("token_seconds") for r in rows]}  # fmt: skip


def measure(plain, drafter, prompts: list[list[int]], batch: int, request) -> dict:
    """One cell: ``prompts`` in chunks of ``batch``, the two engines alternating ABBA; both warmed up on the first
    chunk first. ``request(chunk, tokens)`` builds the engines' request. Counters: the drafter's, over the cell."""
    chunks = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    plain.timed(request(chunks[0], WARMUP_TOKENS))
    before = drafter.timed(request(chunks[0], WARMUP_TOKENS)).get("counters")
    out, after = [], before
    for i, chunk in enumerate(chunks):
        replies = {}
        for name in ("plain", "drafter") if i % 2 == 0 else ("drafter", "plain"):
            replies[name] = (plain if name == "plain" else drafter).timed(request(chunk, None))
        after = replies["drafter"].get("counters")
        same = sum(a["tokens"] == b["tokens"] for a, b in zip(*(replies[n]["outputs"] for n in replies), strict=True))
        out.append({"plain": side(replies["plain"]), "drafter": side(replies["drafter"]), "same": same})
    counters = {k: after[k] - before[k] for k in after} if after else None
    return {"chunks": out, "counters": counters}


def read_scores(scores: list[tuple[str, str]]) -> dict[str, dict[str, dict]]:
    """SET -> drafter name -> the verifier's τ (and K, prompts, tokens) from each ``--score`` file."""
    from draftsmith.eval.rows import read_rows

    out: dict[str, dict[str, dict]] = {}
    for label, spec in scores:
        path, _, block = spec.partition("#")
        data = json.loads(Path(path).read_text())
        if block:
            if block not in data.get("blocks", {}):
                raise SystemExit(f"served.py: --score {spec}: {path} has no block {block!r}")
            data = data["blocks"][block]
        for row in read_rows(data["drafters"]):
            out.setdefault(label, {})[row.name] = {"tau": row.tau, "k": row.k, "prompts": row.prompts,
                                                   "tokens": row.tokens, "source": spec}  # fmt: skip
    return out


def vllm_config(named, target_dir: Path, dtype: str, k: int, work: Path) -> dict:
    """How vLLM serves drafter ``named``: its speculative config, the target it serves and K. A trained drafter is
    exported here (``draftsmith export``, in its serving format); an export dir is served as its manifest says."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.export.registry import serving_format, write_export
    from draftsmith.families.registry import load_network
    from draftsmith.families.specs import NGram, Trained

    if isinstance(named.spec, NGram):
        if named.spec.width > 1:
            raise DraftsmithError(f"--drafter {named.name}: vLLM's n-gram drafts one chain (width 1)")
        config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": named.spec.max_ngram,
                  "prompt_lookup_min": 1}  # fmt: skip
        return {"speculative_config": config, "target": str(target_dir), "k": k, "method": "ngram", "source": None}
    path = Path(named.spec.path)
    manifest = path / "manifest.json"
    if isinstance(named.spec, Trained):
        _, info = load_network(path)
        fmt_ = serving_format(info["method"])
        if fmt_ == "native":
            raise DraftsmithError(f"--drafter {named.name}: vLLM serves no {info['method']} drafter")
        command, method = write_export(path, fmt_, work / "exports" / named.name, dtype, overwrite=True), info["method"]
    elif manifest.is_file() and "serve" in json.loads(manifest.read_text()):
        command, method = json.loads(manifest.read_text())["serve"], "export"
    else:  # a HF causal LM sharing the target's tokenizer
        command = f"vllm serve {target_dir} --speculative-config " + shlex.quote(
            json.dumps({"method": "draft_model", "model": str(path.absolute()), "num_speculative_tokens": k})
        )
        method = "draft_lm"
    words = shlex.split(command)
    served, config = words[2], json.loads(words[words.index("--speculative-config") + 1])
    if config.get("parallel_drafting") or config["method"] == "medusa":  # K at most the depth / heads trained
        config["num_speculative_tokens"] = min(k, config["num_speculative_tokens"])
    else:
        config["num_speculative_tokens"] = k
    served = str(target_dir) if served == "TARGET" else served
    note = f"serves its own target {served}" if Path(served).resolve() != Path(target_dir).resolve() else None
    source = {"path": str(path.absolute()), "modified": path.stat().st_mtime}  # a retrained drafter is measured again
    return {"speculative_config": config, "target": served, "k": config["num_speculative_tokens"], "method": method,
            "note": note, "source": source}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from draftsmith import targets
    from draftsmith.core.machine import native_bf16
    from draftsmith.core.sampling import Sampling
    from draftsmith.core.target import Target
    from draftsmith.data.engines import Request, VLLMEngine, vllm_python
    from draftsmith.data.prompts import encode
    from draftsmith.errors import DraftsmithError

    try:
        python = vllm_python(args.vllm_python)
        target_dir = targets.resolve(args.target)
        sets = {label: load_set(source, args.prompts) for label, source in args.sets.items()}
        scores = read_scores(args.scores)
    except DraftsmithError as e:
        raise SystemExit(f"served.py: {e}") from None
    bf16, why = native_bf16()
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if bf16 else "float32")
    why = why if args.dtype == "auto" else "chosen by --dtype"
    target = Target.from_pretrained(target_dir)
    eos = tuple(target.eos_token_ids)
    prompts = {label: [encode(p, target.tokenizer) for p in ps] for label, ps in sets.items()}
    fingerprint, name = target.fingerprint, Path(str(target_dir)).name
    longest = target.model.config.max_position_embeddings
    del target
    try:
        drafters = {d.name: vllm_config(d, target_dir, dtype, args.k, args.out) for d in args.drafters}
    except DraftsmithError as e:
        raise SystemExit(f"served.py: {e}") from None
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    context = max(len(p) for ps in prompts.values() for p in ps) + args.new_tokens + args.k + 8
    context = min(-(-context // 128) * 128, longest)

    def engine(label: str, served: str, config: dict | None) -> VLLMEngine:
        return VLLMEngine(Path(served), python, dtype, context, max(args.batches), 1, 0, args.out / "logs" / f"{label}.log",
                          eager=args.eager, speculative_config=config, log_stats=True)  # fmt: skip

    def request(chunk: list[list[int]], tokens: int | None) -> Request:
        return Request(chunk, list(range(len(chunk))), Sampling(0.0), tokens or args.new_tokens, eos, context, 0)

    load, plain, cells, computed = Load(), None, [], []
    same_args = {"k": args.k, "prompts": args.prompts, "new_tokens": args.new_tokens, "quick": args.quick}
    inputs = {"target": fingerprint, "dtype": dtype, "eager": args.eager, "vllm": installed_vllm(python)}
    here = machine()
    report = earlier_report(args.results / f"{args.name}.json", here, inputs, same_args)  # read once, before writing
    earlier = earlier_cells(report, drafters, args.sets)
    for dname, d in drafters.items():
        current, failed = None, None
        for label, ps in prompts.items():
            for b in args.batches:
                key = {"drafter": dname, **d, "target_dir": str(target_dir), "dtype": dtype, "eager": args.eager,
                       "set": label, "batch": b, "prompts": ids_hash(ps), "max_tokens": args.new_tokens,
                       "eos": list(eos), "context": context}  # fmt: skip
                path = cell_path(args.out, dname, label, b)
                kept = earlier.get((dname, label, b))
                if not path.is_file() and kept and kept["key"] in (None, key):
                    save_cell(path, kept | {"key": key})  # the report's cell of the same inputs, reused
                cell = load_cell(path, key)
                if cell is None and failed is None:
                    try:
                        plain = plain or engine("plain", str(target_dir), None)
                    except DraftsmithError as e:
                        raise SystemExit(f"served.py: plain vLLM did not start: {e}") from None
                    try:  # a drafter whose engine fails: its cells say why (not saved: a rerun retries them)
                        current = current or engine(dname, d["target"], d["speculative_config"])
                        cell = {
                            "key": key,
                            "vllm": current.version,
                            **measure(plain, current, ps, b, request),
                            "measured": {"git": here["git"], "date": here["date"]},
                        }
                        save_cell(path, cell)
                        computed.append(path.name)
                    except DraftsmithError as e:
                        if plain.proc.poll() is not None:
                            raise SystemExit(f"served.py: plain vLLM stopped: {e}") from None
                        failed = str(e).splitlines()[0]
                if cell is None:
                    cells.append({"drafter": dname, "set": label, "batch": b, "error": failed})
                else:
                    cells.append({"drafter": dname, "set": label, "batch": b, "vllm": cell["vllm"], "key": key,
                                  "measured": cell.get("measured"), "summary": summary(cell),
                                  "chunks": cell["chunks"]})  # fmt: skip
        if current is not None:
            current.close()
    if plain is not None:
        plain.close()
    others, kept, kept_scores = other_drafters(report, drafters, args.sets)
    for label, by in kept_scores.items():  # a score named in this run wins over the kept one
        scores[label] = by | scores.get(label, {})
    drafters, cells = drafters | others, cells + kept
    result = {
        "machine": here, "load": load.span(),
        "vllm": next((c["vllm"] for c in cells if c.get("vllm")), "?"), "target": fingerprint,
        "target_name": name, "dtype": dtype, "dtype_why": why, "eager": args.eager, "batches": args.batches,
        "sets": {label: args.sets[label] for label in prompts}, "drafters": drafters, "scores": scores,
        "args": {"k": args.k, "prompts": args.prompts, "new_tokens": args.new_tokens, "quick": args.quick,
                 "out": str(args.out)},
        "computed": computed, "cells": cells, "kept": sorted(others),
    }  # fmt: skip
    write(args.name, result, markdown(result), args.results)


if __name__ == "__main__":
    main()
