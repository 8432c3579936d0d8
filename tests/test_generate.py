"""``draftsmith generate``: on-policy data that depends only on (target, prompts, settings, seed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from conftest import VOCAB, kill_after_first_shard, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling, probs
from draftsmith.core.target import Target
from draftsmith.data.decode import decode_batch, draw, row_seed
from draftsmith.data.feature_cache import data_identity
from draftsmith.data.generate import check_dataset_target, generate, is_greedy, load_generated
from draftsmith.data.prompts import Prompt, encode
from draftsmith.data.shards import snapshot
from draftsmith.decode.verifier import plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.targets import resolve_target

EOS = VOCAB - 2
CONTEXT = 64


def words(g: torch.Generator, n: int) -> str:
    return " ".join(f"w{i}" for i in torch.randint(0, EOS, (n,), generator=g).tolist())


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A saved tiny target that stops at EOS and has a 64-token context."""
    path = tmp_path_factory.mktemp("gen") / "target"
    model = make_llama(seed=0, eos=EOS)
    model.config.max_position_embeddings = CONTEXT
    model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def prompt_path(tmp_path_factory) -> Path:
    """Ten prompts of 1 to 19 words."""
    g = torch.Generator().manual_seed(0)
    path = tmp_path_factory.mktemp("gen") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": words(g, 1 + 2 * i)}) + "\n" for i in range(10)))
    return path


def run(target_dir: Path, prompts: Path, out: Path, **kwargs) -> tuple[datasets.Dataset, dict]:
    kwargs = {"max_new_tokens": 12, "shard_size": 4, "device": "cpu", **kwargs}
    generate(resolve_target(str(target_dir)), str(prompts), out, **kwargs)
    return load_generated(out)


def test_draw_follows_the_cumulative_distribution_and_never_picks_zero_probability():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0]]).expand(5, 4)
    u = torch.tensor([0.0, 0.25, 0.4999, 0.5, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))])
    assert draw(p, u).tolist() == [1, 1, 1, 2, 2]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.6)])
def test_sampled_tokens_follow_the_target_distribution(temperature, top_p):
    model, sampling, n = make_llama(seed=0), Sampling(temperature, top_p), 3000
    prompt = [5, 17, 3, 40]
    rows = decode_batch(model, [prompt] * n, [row_seed(0, 0, j) for j in range(n)], sampling, max_new_tokens=1)
    freq = torch.bincount(torch.tensor([r.tokens[0] for r in rows]), minlength=VOCAB).float() / n
    with torch.no_grad():
        expected = probs(model(torch.tensor([prompt])).logits[0, -1], sampling)
    assert freq[expected == 0].sum() == 0  # nothing outside the nucleus
    assert 0.5 * (freq - expected).abs().sum() < 0.06  # total variation


def test_output_does_not_depend_on_batch_size(target_dir, prompt_path, tmp_path):
    settings = {"temperature": 1.0, "top_p": 0.9, "samples_per_prompt": 2, "store_topk": 2}
    one, _ = run(target_dir, prompt_path, tmp_path / "b1", batch_size=1, **settings)
    three, _ = run(target_dir, prompt_path, tmp_path / "b3", batch_size=3, **settings)
    assert one["input_ids"] == three["input_ids"]
    # padding changes the logits by float rounding only
    for a, b in zip(one["topk_logprobs"], three["topk_logprobs"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    # another seed gives other samples; the two samples of a prompt differ
    other, _ = run(target_dir, prompt_path, tmp_path / "s1", batch_size=3, **{**settings, "seed": 1})
    assert other["input_ids"] != one["input_ids"]
    assert one["input_ids"][0] != one["input_ids"][1]


def test_greedy_generation_equals_plain_greedy_decoding(target_dir, prompt_path, tmp_path):
    data, _ = run(target_dir, prompt_path, tmp_path / "greedy", temperature=0.0, batch_size=4)
    target = Target.from_pretrained(target_dir)
    for row in data:
        prompt = row["input_ids"][: row["prompt_len"]]
        expected = plain_decode(target, prompt, 12, Sampling()).tokens
        assert row["input_ids"][row["prompt_len"] :] == expected


def test_greedy_share_decodes_that_share_of_prompts_greedily_and_samples_the_rest(target_dir, prompt_path, tmp_path):
    mixed, meta = run(target_dir, prompt_path, tmp_path / "mixed", temperature=1.0, greedy_share=0.3, batch_size=3)
    greedy, _ = run(target_dir, prompt_path, tmp_path / "greedy", temperature=0.0, batch_size=3)
    sampled, _ = run(target_dir, prompt_path, tmp_path / "sampled", temperature=1.0, batch_size=3)
    chosen = [i for i in range(10) if is_greedy(i, 0.3)]
    assert chosen == [3, 6, 9]  # spread evenly over the prompt order
    for i in range(10):
        assert mixed["input_ids"][i] == (greedy if i in chosen else sampled)["input_ids"][i]
    assert meta["settings"]["greedy_share"] == 0.3


def test_rows_hold_prompt_then_generation_with_loss_mask_on_generated_tokens(target_dir, prompt_path, tmp_path):
    data, meta = run(target_dir, prompt_path, tmp_path / "rows", samples_per_prompt=3, batch_size=4)
    tokenizer = Target.from_pretrained(target_dir).tokenizer
    texts = [json.loads(line)["prompt"] for line in prompt_path.read_text().splitlines()]
    assert [(r["prompt_index"], r["sample_index"]) for r in data] == [(i, j) for i in range(10) for j in range(3)]
    ended_at_eos = 0
    for row in data:
        prompt, n = encode(Prompt(texts[row["prompt_index"]]), tokenizer), row["prompt_len"]
        generated = row["input_ids"][n:]
        assert row["input_ids"][:n] == prompt and n == len(prompt)
        assert row["loss_mask"] == [0] * n + [1] * len(generated)
        assert 1 <= len(generated) <= 12
        assert EOS not in generated[:-1]  # a row stops at its EOS and keeps it
        if len(generated) < 12:
            assert generated[-1] == EOS
        ended_at_eos += generated[-1] == EOS
    assert ended_at_eos == meta["stopped_at_eos"] > 0


def test_stored_topk_logprobs_equal_the_target_teacher_forced(target_dir, prompt_path, tmp_path):
    data, _ = run(target_dir, prompt_path, tmp_path / "topk", store_topk=4, batch_size=4, temperature=0.8)
    model = Target.from_pretrained(target_dir).model
    for row in data:
        n, ids = row["prompt_len"], torch.tensor([row["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, n - 1 : -1].float(), -1)  # (generated, V)
        top, top_ids = logprobs.topk(4, -1)
        assert row["topk_ids"] == top_ids.tolist()
        torch.testing.assert_close(torch.tensor(row["topk_logprobs"]), top, atol=1e-5, rtol=0)


def test_metadata_round_trip(target_dir, prompt_path, tmp_path):
    out = tmp_path / "meta"
    data, meta = run(target_dir, prompt_path, out, seed=7, temperature=0.9, top_p=0.95, num_prompts=6, batch_size=4)
    assert meta["status"] == "complete"
    assert meta["target"] == Target.from_pretrained(target_dir).fingerprint
    assert meta["settings"] == {
        "prompts": str(prompt_path),
        "prompt_field": "prompt",
        "num_prompts": 6,
        "chat_template": True,
        "temperature": 0.9,
        "top_p": 0.95,
        "max_new_tokens": 12,
        "samples_per_prompt": 1,
        "seed": 7,
        "shard_size": 4,
        "store_topk": 0,
        "greedy_share": 0.0,
        "dtype": "float32",
        "engine": "hf",
    }
    assert meta["engine"] == {"name": "hf", "version": transformers.__version__}
    assert meta["rows"] == len(data) == meta["prompts_used"] == 6 and meta["shards"] == 2
    assert meta["generated_tokens"] == sum(sum(m) for m in data["loss_mask"])
    assert meta["prompt_tokens"] == sum(data["prompt_len"])
    assert meta["skipped_too_long"] == 0 and meta["tokens_per_s"] > 0
    assert meta["versions"]["draftsmith"] and "command" in meta
    assert datasets.load_from_disk(str(out))["input_ids"] == data["input_ids"]
    assert not (out / "shards").exists()


def test_prompts_that_fill_the_context_are_skipped_and_counted(target_dir, tmp_path, capsys):
    g = torch.Generator().manual_seed(3)
    lengths = [5, CONTEXT + 6, CONTEXT, CONTEXT - 2]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt": words(g, n)}) + "\n" for n in lengths))
    data, meta = run(target_dir, path, tmp_path / "long", temperature=0.0)
    assert meta["skipped_too_long"] == 2 and meta["rows"] == 2
    assert data["prompt_index"] == [0, 3]
    assert len(data["input_ids"][1]) <= CONTEXT  # stopped at the context, not at max_new_tokens
    assert "skipped 2 prompts that reach the target's 64-token context" in capsys.readouterr().out
    path.write_text(json.dumps({"prompt": words(g, CONTEXT)}) + "\n")
    with pytest.raises(DraftsmithError, match=r"none of the 1 prompts .*\(1 reach the target's 64-token context"):
        run(target_dir, path, tmp_path / "none")


def test_non_empty_out_needs_resume_or_overwrite(target_dir, prompt_path, tmp_path, capsys):
    out = tmp_path / "again"
    first, _ = run(target_dir, prompt_path, out, num_prompts=3)
    with pytest.raises(DraftsmithError, match=r"is not empty; pass --resume .* or --overwrite"):
        run(target_dir, prompt_path, out, num_prompts=3)
    again, _ = run(target_dir, prompt_path, out, num_prompts=3, resume=True)  # complete: nothing to do
    assert "already complete" in capsys.readouterr().out and again["input_ids"] == first["input_ids"]
    replaced, meta = run(target_dir, prompt_path, out, num_prompts=3, overwrite=True, seed=5)
    assert meta["settings"]["seed"] == 5 and replaced["input_ids"] != first["input_ids"]
    with pytest.raises(DraftsmithError, match=r"seed=5 \(now 6\).* or use --overwrite"):
        run(target_dir, prompt_path, out, num_prompts=3, resume=True, seed=6)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DraftsmithError, match="did not write .*refusing to delete"):
        run(target_dir, prompt_path, foreign, overwrite=True)
    assert (foreign / "notes.txt").is_file()


def test_dataset_used_with_another_target_is_refused_naming_both(target_dir, prompt_path, model_dirs, tmp_path):
    _, meta = run(target_dir, prompt_path, tmp_path / "fp", num_prompts=2)
    check_dataset_target(meta, Target.from_pretrained(target_dir))
    with pytest.raises(DraftsmithError, match=rf"data was made for target '{target_dir}' but is used with target "):
        check_dataset_target(meta, Target.from_pretrained(model_dirs["foreign"]), "data")


def test_unfinished_run_cannot_be_loaded(target_dir, prompt_path, tmp_path):
    out = tmp_path / "unfinished"
    run(target_dir, prompt_path, out, num_prompts=2)
    meta = json.loads((out / "draftsmith.json").read_text())
    (out / "draftsmith.json").write_text(json.dumps({**meta, "status": "running"}))
    with pytest.raises(DraftsmithError, match="unfinished generation run; finish it with .*--resume"):
        load_generated(out)


def test_chat_prompts_use_the_chat_template_and_datasets_give_prompts(target_dir, tmp_path):
    chat_dir = tmp_path / "chat-target"
    Target.from_pretrained(target_dir).model.save_pretrained(chat_dir)
    tokenizer = make_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}w1 {{ m['content'] }} {% endfor %}w2"
    tokenizer.save_pretrained(chat_dir)
    messages = [{"role": "user", "content": "w7 w8"}]
    chat_file = tmp_path / "chat.jsonl"
    chat_file.write_text(json.dumps({"messages": messages}) + "\n")
    data, _ = run(chat_dir, chat_file, tmp_path / "chat")
    assert data[0]["input_ids"][: data[0]["prompt_len"]] == tokenizer("w1 w7 w8 w2")["input_ids"]
    plain, _ = run(chat_dir, chat_file, tmp_path / "plain", chat_template=False)
    assert plain[0]["prompt_len"] != data[0]["prompt_len"]  # "user: w7 w8\nassistant: " instead

    saved = tmp_path / "prompt-dataset"
    datasets.Dataset.from_dict({"text": ["w3 w4 w5", "w6"]}).save_to_disk(str(saved))
    from_disk, meta = run(target_dir, saved, tmp_path / "from-disk", prompt_field="text")
    assert from_disk["prompt_len"] == [3, 1] and meta["settings"]["prompt_field"] == "text"


def test_magpie_through_generate_writes_what_the_magpie_loop_writes(target_dir, tmp_path):
    """Self-written instructions decoded by ``generate`` (any engine; here HF) are the ones ``write_instructions``'
    own loop samples: the same rows, seeds and sampling, kept by the same rule (the turn ended, >= 4 words, new)."""
    from draftsmith.data.magpie import user_prefix, write_instructions, write_instructions_generated

    chat_dir = tmp_path / "chat-target"
    Target.from_pretrained(target_dir).model.save_pretrained(chat_dir)
    tokenizer = make_tokenizer()
    tokenizer.chat_template = "w1 {% for m in messages %}w2 {{ m['content'] }} w3 {% endfor %}"
    tokenizer.save_pretrained(chat_dir)
    assert tokenizer.decode(user_prefix(tokenizer)) == "w1 w2"
    loop, generated = tmp_path / "loop.jsonl", tmp_path / "generated.jsonl"
    n, rows = 100, 400  # neither reaches n: both decode rows 0..399 and keep every finished one
    write_instructions(Target.from_pretrained(chat_dir), n, loop, seed=3, max_new_tokens=24, batch_size=rows)
    written = write_instructions_generated(
        resolve_target(str(chat_dir)),
        n,
        generated,
        tmp_path / "work",
        seed=3,
        max_new_tokens=24,
        oversample=rows / n,
        batch_size=16,
    )
    kept = [json.loads(line)["messages"] for line in generated.read_text().splitlines()]
    assert 0 < written == len(kept) < n
    assert kept == [json.loads(line)["messages"] for line in loop.read_text().splitlines()]
    assert all(len(m[0]["content"].split()) >= 4 for m in kept)


def cli_error(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("draftsmith: error:") == 1
    return err


def test_bad_input_is_one_line_naming_the_problem(target_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1"}\n{"prompt": \n')
    common = ["--target", str(target_dir), "--out", str(tmp_path / "o"), "--device", "cpu"]
    assert f"{bad}:2: malformed JSON" in cli_error(capsys, *common, "--prompts", str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no prompts" in cli_error(capsys, *common, "--prompts", str(empty))
    assert "--num_prompts must be positive, got 0" in cli_error(capsys, *common, "--num-prompts", "0")
    assert "top_p must be in (0, 1]" in cli_error(capsys, *common, "--top-p", "0")
    assert "--greedy-share must be in [0, 1], got 1.5" in cli_error(capsys, *common, "--greedy_share", "1.5")


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted_run(target_dir, tmp_path):
    """Kill a real ``draftsmith generate`` process mid-run, resume it, compare with a run never interrupted."""
    g = torch.Generator().manual_seed(5)
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": words(g, 1 + i % 13)}) + "\n" for i in range(64)))
    settings = {"shard_size": 4, "batch_size": 1, "max_new_tokens": 24, "store_topk": 2}
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "draftsmith.cli", "generate", "--target", str(target_dir)]
    cmd += ["--prompts", str(prompts), "--out", str(out), "--device", "cpu"]
    cmd += [f"--{k}={v}" for k, v in settings.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    saved = kill_after_first_shard(cmd, out, 120, env)
    print(f"killed after {saved} of 16 shards")
    assert 1 <= saved < 16 and json.loads((out / "draftsmith.json").read_text())["status"] == "running"
    with pytest.raises(DraftsmithError, match="unfinished"):
        load_generated(out)
    prefix, prefix_meta = load_generated(snapshot(out, tmp_path / "snapshot"))  # the finished shards, meanwhile

    # batch size is free to change on resume: it does not change the output
    resumed, meta = run(target_dir, prompts, out, resume=True, **{**settings, "batch_size": 16})
    reference, _ = run(target_dir, prompts, tmp_path / "reference", **{**settings, "batch_size": 16})
    assert resumed["input_ids"] == reference["input_ids"]
    assert resumed["topk_ids"] == reference["topk_ids"]
    assert meta["rows"] == 64 and meta["shards"] == 16
    # the snapshot is the whole run's first rows, counted as such, and never taken for the whole run's data
    assert prefix["input_ids"] == reference["input_ids"][: 4 * saved]
    assert prefix_meta["rows"] == 4 * saved and prefix_meta["snapshot"]["shards"] == saved
    assert prefix_meta["generated_tokens"] == sum(sum(m) for m in reference["loss_mask"][: 4 * saved])
    assert data_identity(prefix_meta) != data_identity(meta)
    # once the run is done (its shards merged), a snapshot of the same dest is all of it
    whole, whole_meta = load_generated(snapshot(out, tmp_path / "snapshot"))
    assert whole["input_ids"] == reference["input_ids"] and whole_meta["snapshot"]["shards"] == 16
    assert whole_meta["generated_tokens"] == meta["generated_tokens"]
    assert data_identity(whole_meta) not in (data_identity(meta), data_identity(prefix_meta))
    started = tmp_path / "started"  # a run that has written its metadata but no shard yet
    started.mkdir()
    (started / "draftsmith.json").write_text(json.dumps({**meta, "status": "running"}))
    with pytest.raises(DraftsmithError, match="no finished shard"):
        snapshot(started, tmp_path / "none")


def test_ctrl_c_keeps_saved_shards_and_resume_completes_the_same_dataset(
    target_dir, prompt_path, tmp_path, monkeypatch, capsys
):
    from draftsmith.data import engines

    calls = {"n": 0}

    def interrupted_on_third_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return decode_batch(*args, **kwargs)

    settings = {"shard_size": 2, "batch_size": 2, "temperature": 1.0}
    out = tmp_path / "ctrl-c"
    with monkeypatch.context() as patch:
        patch.setattr(engines, "decode_batch", interrupted_on_third_batch)
        with pytest.raises(KeyboardInterrupt):
            run(target_dir, prompt_path, out, **settings)
    assert "interrupted: 2 of 5 shards are saved" in capsys.readouterr().err
    resumed, _ = run(target_dir, prompt_path, out, resume=True, **settings)
    reference, _ = run(target_dir, prompt_path, tmp_path / "reference", **settings)
    assert resumed["input_ids"] == reference["input_ids"]


def test_generation_stops_at_any_of_a_list_of_eos_tokens():
    model = make_llama(seed=0)
    prompts, seeds = [[1, 2, 3, 4], [5, 6, 7]], [0, 0]
    free = decode_batch(model, prompts, seeds, Sampling(), 12)
    stops = [free[0].tokens[4], free[1].tokens[6]]
    for row, stopped in zip(free, decode_batch(model, prompts, seeds, Sampling(), 12, stops), strict=True):
        end = next(i for i, t in enumerate(row.tokens) if t in stops)
        assert stopped.tokens == row.tokens[: end + 1]


def test_vllm_engine_without_its_venv_or_an_unknown_engine_is_one_line(target_dir, prompt_path, tmp_path, capsys):
    common = ["--target", str(target_dir), "--prompts", str(prompt_path), "--out", str(tmp_path / "o")]
    err = cli_error(capsys, *common, "--engine", "vllm", "--vllm-python", str(tmp_path / "none" / "python"))
    assert f"--engine vllm: no vLLM interpreter at {tmp_path / 'none' / 'python'}" in err
    assert "vllm_venv.sh .venv-vllm" in err
    assert "--engine must be one of hf, vllm, got 'sglang'" in cli_error(capsys, *common, "--engine", "sglang")
    assert "--tensor-parallel-size must be a positive integer, got 0" in cli_error(
        capsys, *common, "--tensor-parallel-size", "0"
    )


def test_the_vllm_worker_gets_a_step_timeout_that_a_shared_cpu_survives_unless_the_user_set_one(monkeypatch):
    """vLLM's default (300 s for one model step) stopped a 1M-token generation on 2 cores shared with other work."""
    from draftsmith.data.engines import STEP_TIMEOUT, worker_env

    monkeypatch.delenv(STEP_TIMEOUT, raising=False)
    assert int(worker_env()[STEP_TIMEOUT]) >= 3600
    monkeypatch.setenv(STEP_TIMEOUT, "42")
    assert worker_env()[STEP_TIMEOUT] == "42"
