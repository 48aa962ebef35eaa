"""training/data.py (issue 41): batched generation with a KV cache, left padding and continuous
refill gives each row what unbatched decoding gives; the shards resume; the readers give the
trainers' formats."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import tiny_lm
from tests.training.scripts import load_script

data = load_script("data", "specscope_training_data")
STOP = 3


def _reference_greedy(model, prompt: list[int], max_new: int, stop: set[int]) -> list[int]:
    """Unbatched greedy decoding by full recomputation: no padding, no cache."""
    ids, out = list(prompt), []
    with torch.no_grad():
        while len(out) < max_new:
            t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(t)
            ids.append(t)
            if t in stop:
                break
    return out


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (n,), generator=g).tolist()
    return [torch.randint(4, 64, (n_i,), generator=g).tolist() for n_i in lengths]


@pytest.mark.parametrize("refill", [True, False])
def test_a_batched_greedy_row_equals_unbatched_greedy_decoding(refill):
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(11)
    jobs = [data.Job(f"p{i}", p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=9, stop={STOP}, batch=4, refill=refill)}
    assert len(got) == len(prompts)
    for i, p in enumerate(prompts):
        assert got[f"p{i}"] == _reference_greedy(model, p, 9, {STOP}), i


def test_rows_end_at_a_stop_token_and_leave_the_batch(monkeypatch):
    merges = []
    merge = data._merge
    monkeypatch.setattr(data, "_merge", lambda *a: merges.append(a[1].shape[1]) or merge(*a))
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(30, seed=1)
    ref = [_reference_greedy(model, p, 12, {5, 9, 17}) for p in prompts]
    assert any(r[-1] in {5, 9, 17} and len(r) < 12 for r in ref), "the check needs rows that end early"
    jobs = [data.Job(f"p{i}", p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=12, stop={5, 9, 17}, batch=8)}
    assert [got[f"p{i}"] for i in range(len(prompts))] == ref
    assert merges, "new prompts joined a running batch (continuous refill)"


def test_a_sampled_row_does_not_depend_on_its_batch():
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(9, seed=2)

    def run(batch: int) -> dict[str, list[int]]:
        jobs = [data.Job(f"p{i}", p, sample=True, seed=100 + i) for i, p in enumerate(prompts)]
        return {j.key: j.answer for j in data.generate(model, jobs, max_new=8, stop={STOP}, batch=batch)}

    one, four = run(1), run(4)
    assert one == four
    assert len({tuple(v) for v in one.values()}) > 1


def test_a_sampled_row_draws_from_the_softmax_at_its_temperature():
    """_pick's inverse-CDF draw, per row with its own generator, has the row's distribution:
    a chi-square test over 20,000 draws of two rows at different temperatures (and a greedy
    row between them, which stays the argmax)."""
    from scipy.stats import chisquare

    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0, -3.0]]).repeat(3, 1)
    for temperature in (1.0, 0.6):
        job = data.Job("s", [1], sample=True, seed=7, temperature=temperature)
        job.gen = torch.Generator().manual_seed(7)
        greedy = data.Job("g", [1])
        counts = torch.zeros(6)
        for _ in range(20_000):
            picks = data._pick(logits, [job, greedy, None])
            counts[picks[0]] += 1
            assert picks[1] == 0
        want = torch.softmax(logits[0].double() / temperature, -1) * counts.sum()
        assert chisquare(counts.numpy(), want.numpy()).pvalue > 1e-3


@pytest.mark.real_model
def test_smollm2_batched_greedy_equals_unbatched():
    from specscope.core.loading import catalog

    if not catalog.fetched_gguf(catalog.lookup("smollm2")).is_file():
        pytest.skip("SmolLM2 is not fetched (`specscope models fetch smollm2`)")
    from specscope.core.loading.chat import chat_prompt_ids

    model, tok, stop = data.load_target("smollm2", 1)
    users = ["Why is the sky blue?", "Write a Python function that reverses a string.", "What is DNA?"]
    prompts = [chat_prompt_ids(tok, u) for u in users]
    jobs = [data.Job(str(i), p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=24, stop=stop, batch=3)}
    for i, p in enumerate(prompts):
        assert got[str(i)] == _reference_greedy(model, p, 24, stop), users[i]


TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    """A tiny random Llama with the bundled target's tokenizer and a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specscope.core.loading import bundled_path, load_tokenizer

    folder = tmp_path_factory.mktemp("chat-target")
    tok = load_tokenizer(bundled_path("target"))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    return folder


def _run(target, out, tokens: int, *extra: str) -> None:
    data.main(
        [
            *extra,
            "--target",
            str(target),
            "--out",
            str(out),
            "--tokens",
            str(tokens),
            "--per-topic",
            "0",
            "--heldout-per-kind",
            "2",
            "--max-new",
            "12",
            "--batch",
            "8",
            "--text-windows",
            "4",
            "--text-len",
            "32",
            "--layers",
            "0,1,2",
            "--top-k",
            "16",
            "--no-docs",  # where python3-doc is installed it is used all the same
        ]
    )


def test_the_data_run_makes_every_kind_resumes_and_reads_back(chat_target, tmp_path):
    import json

    out = tmp_path / "d"
    _run(chat_target, out, 150)
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    for kind in data.KINDS:
        for split in ("train", "held"):
            assert any(p["kind"] == kind and p["split"] == split for p in prompts), (kind, split)
    bundled = {p["user"] for p in data.prompts_mod.bundled_prompts()}
    assert all(p["split"] == "held" for p in prompts if p["user"] in bundled)
    first = sorted(out.glob("answers-*.pt"))
    rows = [r for f in first for r in torch.load(f, weights_only=False)]
    train_tokens = sum(len(r["answer"]) for r in rows if r["split"] == "train")
    assert train_tokens >= 150
    assert {r["kind"] for r in rows if r["split"] == "held"} == set(data.KINDS)
    assert {r["mode"] for r in rows if r["split"] == "train"} == {"greedy", "sampled"}
    log = (out / "data_log.txt").read_text()
    assert "tokens/s" in log and "ETA" in log

    # a second run with a larger budget keeps what is there and adds the rest (resume)
    before = {f.name: f.read_bytes() for f in first}
    _run(chat_target, out, 400)
    assert all((out / name).read_bytes() == b for name, b in before.items())
    rows = [r for f in sorted(out.glob("answers-*.pt")) for r in torch.load(f, weights_only=False)]
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys))
    assert sum(len(r["answer"]) for r in rows if r["split"] == "train") >= 400
    assert len(sorted(out.glob("features-0*.pt"))) == len(sorted(out.glob("answers-*.pt")))
    assert "nothing to do" in (_run(chat_target, out, 400) or (out / "data_log.txt").read_text())


@pytest.fixture(scope="module")
def small_data(chat_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "d"
    _run(chat_target, out, 60)
    return out


def test_features_are_the_targets_own_and_the_trainers_read_them(chat_target, small_data):
    from specscope.core.loading import load_model

    out = small_data
    model = load_model(chat_target, device="cpu", dtype="float32", role="target")
    rows = list(data.load_rows(out))
    assert {r["kind"] for r in rows} >= {"text", "chat"}
    for r in rows[:3] + [r for r in rows if r["kind"] == "text"][:1]:
        with torch.no_grad():
            full = model(input_ids=r["tokens"][None], output_hidden_states=True)
        for j, layer in enumerate((0, 1, 2)):
            torch.testing.assert_close(r["features"][:, j].float(), full.hidden_states[layer][0], atol=0.05, rtol=0.02)
        top = torch.log_softmax(full.logits[0], -1).topk(16, -1)
        assert (r["top_ids"][:, 0] == top.indices[:, 0]).float().mean() > 0.95
        torch.testing.assert_close(r["top_logp"][:, 0].float(), top.values[:, 0], atol=0.02, rtol=0.01)

    drafts = data.draft_rows(out, "train", top_k=16)
    assert drafts and all(len(d["top_ids"]) == len(d["answer"]) for d in drafts)
    d = drafts[0]
    # the position before each answer token holds the distribution over that token
    row = next(r for r in rows if r["split"] == "train" and r["kind"] != "text")
    p = row["prompt_len"]
    assert row["tokens"][p:].tolist() == next(x for x in drafts if x["prompt"] == row["tokens"][:p].tolist())["answer"]
    assert d["top_ids"].shape[1] == 16

    stop = model.generation_config.eos_token_id
    cached = data.head_cached(out, "train", seq_len=48, top_k=16, stop=stop)
    assert cached.tokens.shape[1] == 48 and cached.features.shape[2:] == (3, 32)
    assert int(cached.valid.sum()) > 0 and len(cached) == sum(r["split"] == "train" for r in rows)
    # a chat answer's labels start after its prompt, as train_head.cache_answers has them (the
    # prompt's positions counted as labels overstated the SmolLM2 head's chat accuracy: issue 41)
    answers = [i for i, r in enumerate(data.load_rows(out, "train")) if r["kind"] != "text"]
    assert answers
    for i in answers:
        assert not cached.valid[i, : int(cached.first[i]) + 1].any()
        assert cached.valid[i, int(cached.first[i]) + 1 :].any()


def test_head_sets_read_once_equal_each_split_read_alone(chat_target, small_data):
    # head_sets reads every shard once and copies each row out of it (a 1M-token run's shards
    # would otherwise all stay in memory beside the cache); what it gives is what reading each
    # split alone gives, the training rows in the seeded order
    import numpy as np

    stop = 0
    train, held, prov = data.head_sets(small_data, seq_len=40, top_k=8, stop=stop, seed=7)
    alone = data.head_cached(small_data, "train", seq_len=40, top_k=8, stop=stop)
    order = torch.from_numpy(np.random.default_rng(7).permutation(len(alone)))
    alone = alone.rows(order)
    kinds = {r["kind"] for r in data.load_rows(small_data, "held")} - {"text"}
    assert set(held) == {"text"} | {f"greedy-{k}" for k in kinds}
    pairs = [(train, alone)] + [
        (held[name], data.head_cached(small_data, "held", 40, 8, stop, (name.removeprefix("greedy-"),)))
        for name in held
    ]
    for got, want in pairs:
        for field in ("tokens", "features", "top_ids", "top_logp", "valid", "first"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert prov["train_sequences"] == len(alone)


def test_head_sets_read_several_folders_as_one_set(chat_target, small_data):
    # a second data run (another seed) adds to the first: its training rows join the training
    # set; a prompt held out in both (the split is a hash of the prompt) keeps one greedy answer
    train, held, prov = data.head_sets(small_data, seq_len=40, top_k=8, stop=0, seed=7)
    both, held_both, prov_both = data.head_sets([small_data, small_data], seq_len=40, top_k=8, stop=0, seed=7)
    assert len(both) == 2 * len(train) and prov_both["train_sequences"] == 2 * len(train)
    assert int(both.valid.sum()) == 2 * int(train.valid.sum())
    assert set(held_both) == set(held)
    for name in held:
        if name.startswith("greedy-"):
            assert torch.equal(held_both[name].tokens, held[name].tokens), name
    assert len(held_both["text"]) == 2 * len(held["text"])  # text windows differ by seed: all kept
    assert isinstance(prov_both["recipe"], list) and len(prov_both["recipe"]) == 2
    assert str(small_data) in prov_both["source"]
    # the draft's trainer reads the same rows: its held-out answers are counted once too
    assert len(data.draft_rows([small_data, small_data], "held")) == len(data.draft_rows(small_data, "held"))


def test_a_written_prompt_is_one_line_of_sensible_length():
    assert data.clean_prompt('Question: "What makes bread rise?"\nMore text') == "What makes bread rise?"
    assert data.clean_prompt("Sure!") is None
    assert data.clean_prompt("1. first\n2. second") is None
    assert data.clean_prompt("3. Why do leaves fall in autumn?", "chat") == "Why do leaves fall in autumn?"
    assert data.clean_prompt("Leaves fall in autumn, as everyone knows.", "chat") is None
    assert data.clean_prompt("Write a haiku about rain in the city.", "prose") is not None
    assert data.clean_prompt("A story about friendship and daring would be lovely.", "prose") is None
    assert data.clean_prompt("Write a function that sorts a list of names.", "code") is not None
    assert data.clean_prompt("Tell me about your favourite sorting idea today.", "code") is None


def test_train_head_trains_on_the_shards(chat_target, small_data, tmp_path):
    th = load_script("train_head", "specscope_train_head_data")
    args = ["--target", str(chat_target), "--data", str(small_data), "--smoke", "--out"]
    summary = th.main([*args, str(tmp_path), "--layers", "0,1,2"])
    assert summary["data"]["source"].startswith("training/data.py")
    held = summary["evals"][-1]
    assert {"text", "greedy-chat", "greedy-code"} <= set(held)
    assert "accepted_length" in held["greedy-chat"]
    with pytest.raises(SystemExit, match="layers"):
        th.main([*args, str(tmp_path / "x")])


def test_no_new_prompt_starts_once_the_budget_is_spent():
    model = tiny_lm("llama", seed=0, init_range=0.3)
    jobs = [data.Job(f"p{i}", p) for i, p in enumerate(_prompts(10, seed=3))]
    done: list[data.Job] = []
    for job in data.generate(model, jobs, max_new=4, stop=set(), batch=2, refill=False, more=lambda: len(done) < 3):
        done.append(job)
    assert len(done) == 4  # two full batches: the budget was still open when the second one started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch must be at least 1"),
        (["--tokens", "-5"], "--tokens must not be negative"),
        (["--target", "/nonexistent/model"], "training.data: "),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    with pytest.raises(SystemExit) as exc:
        data.main(["--out", str(tmp_path / "d"), "--no-docs", *args])
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_killed_run_continues_where_it_stopped(chat_target, tmp_path, monkeypatch):
    out = tmp_path / "d"
    real = data.generate
    answered = []

    def killed_after_20(*args, **kwargs):
        for job in real(*args, **kwargs):
            if len(answered) == 20:
                raise KeyboardInterrupt
            answered.append(job.key)
            yield job

    monkeypatch.setattr(data, "generate", killed_after_20)
    with pytest.raises(KeyboardInterrupt):
        _run(chat_target, out, 300, "--shard-tokens", "40")
    monkeypatch.setattr(data, "generate", real)
    kept = {f.name: f.read_bytes() for f in out.glob("answers-*.pt")}
    assert kept and not list(out.glob("*.tmp")) and not list(out.glob("features-*"))
    saved = [r["key"] for f in sorted(out.glob("answers-*.pt")) for r in torch.load(f, weights_only=False)]
    assert set(saved) <= set(answered[:20])
    _run(chat_target, out, 300, "--shard-tokens", "40")
    assert all((out / name).read_bytes() == b for name, b in kept.items())
    rows = [r for f in sorted(out.glob("answers-*.pt")) for r in torch.load(f, weights_only=False)]
    assert len({r["key"] for r in rows}) == len(rows)
    assert sum(len(r["answer"]) for r in rows if r["split"] == "train") >= 300
    assert "resuming with" in (out / "data_log.txt").read_text()


def test_no_training_text_window_comes_from_a_file_with_a_held_out_summary(monkeypatch):
    import importlib

    from specscope.core.loading import bundled_path, load_tokenizer

    tm = importlib.import_module("train_models")  # training/ is on sys.path (data.py puts it there)
    monkeypatch.setattr(tm, "list_stdlib_files", lambda root: ["abc.py", "os.py", "string.py"])
    monkeypatch.setattr(tm, "split_files", lambda files, percent: (files, ["this.py"]))
    monkeypatch.setattr(data.prompts_mod, "docs_root", lambda: None)
    tok = load_tokenizer(bundled_path("target"))
    os_doc = " ".join(__import__("os").__doc__.split())
    rows = data.text_rows(tok, 30, 32, seed=0, held_passages=[os_doc[:200]])
    sources = {r["source"] for r in rows if r["split"] == "train"}
    assert sources == {"stdlib:abc.py", "stdlib:string.py"}
    assert data.text_rows(tok, 30, 32, seed=0) and any(
        r["source"] == "stdlib:os.py" for r in data.text_rows(tok, 30, 32, seed=0)
    )


def test_train_smollm2_draft_trains_on_the_shards(chat_target, small_data, tmp_path, monkeypatch):
    from specscope.core.loading import load_model, load_tokenizer

    sd = load_script("train_smollm2_draft", "specscope_train_draft_data")
    model = load_model(chat_target, device="cpu", dtype="float32", role="target")
    tok = load_tokenizer(chat_target)
    monkeypatch.setattr(sd, "load_target", lambda threads: (model, tok, tok.eos_token_id, chat_target))
    small = ["--hidden", "16", "--intermediate", "32", "--heads", "2"]  # the tiny target is 32 wide
    report = sd.main(
        ["--data", str(small_data), "--smoke", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), *small]
    )
    answers = data.draft_rows(small_data, "train")
    assert report["data"]["train_answer_tokens"] == sum(len(r["answer"]) for r in answers) > 0
    assert report["heldout_alpha"]["all"]["positions"] > 0
    # --init continues from the written draft: with no step taken it writes the same weights back
    sd.main(
        [
            "--data",
            str(small_data),
            "--smoke",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path / "again"),
            "--init",
            str(tmp_path / "o"),
            "--steps",
            "0",
        ]
    )
    from safetensors.torch import load_file

    before, after = load_file(tmp_path / "o" / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert "continuing from" in (tmp_path / "again" / "train_log.txt").read_text()


def test_a_written_prompt_that_copies_the_seeds_example_is_dropped(chat_target, tmp_path, monkeypatch):
    from specscope.core.loading import load_model, load_tokenizer

    model = load_model(chat_target, device="cpu", dtype="float32", role="target")
    tok = load_tokenizer(chat_target)
    copied = tok("Why do cats purr?", add_special_tokens=False)["input_ids"]
    fresh = tok("Why do owls hunt at night?", add_special_tokens=False)["input_ids"]

    def answers(_model, jobs, **_kw):
        for i, job in enumerate(jobs):
            job.answer = list(copied if i % 2 else fresh)
            yield job

    monkeypatch.setattr(data, "generate", answers)
    monkeypatch.setattr(data, "TOPICS", ["owls"])
    prompts = data.build_prompt_set(
        model, tok, tmp_path, per_topic=2, stop={0}, batch=4, seed=0, log=print, topics_cap=1
    )
    written = {p["user"] for p in prompts if p.get("source") == "target"}
    assert written == {"Why do owls hunt at night?"}


def test_bfloat16_is_refused_where_the_cpu_would_emulate_it(tmp_path, monkeypatch):
    import train_models as tm

    monkeypatch.setattr(tm, "native_bfloat16", lambda: False)
    with pytest.raises(SystemExit) as exc:
        data.main(["--out", str(tmp_path / "d"), "--bfloat16", "answers"])
    assert "natively" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "d").exists()  # refused before anything is written


@pytest.mark.parametrize(("mode", "answers_bf16", "features_bf16"), [("answers", True, False), ("all", True, True)])
def test_bfloat16_autocast_covers_the_stages_it_names(
    chat_target, tmp_path, monkeypatch, mode, answers_bf16, features_bf16
):
    import train_models as tm

    monkeypatch.setattr(tm, "native_bfloat16", lambda: True)  # autocast runs (slowly) on any CPU
    seen: dict[str, bool] = {}
    real_answers, real_features = data.make_answers, data.make_features

    def answers(*args, **kwargs):
        seen["answers"] = torch.is_autocast_enabled("cpu")
        return real_answers(*args, **kwargs)

    def features(*args, **kwargs):
        seen["features"] = torch.is_autocast_enabled("cpu")
        return real_features(*args, **kwargs)

    monkeypatch.setattr(data, "make_answers", answers)
    monkeypatch.setattr(data, "make_features", features)
    _run(chat_target, tmp_path / "d", 20, "--bfloat16", mode)
    assert seen == {"answers": answers_bf16, "features": features_bf16}
    assert "bfloat16 autocast " + mode in (tmp_path / "d" / "data_log.txt").read_text()
    rows = list(data.load_rows(tmp_path / "d"))
    assert rows and all(r["features"].dtype == torch.bfloat16 for r in rows)


def test_a_machine_without_the_python_docs_is_told_before_anything_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(data.prompts_mod, "docs_root", lambda: None)
    with pytest.raises(SystemExit) as exc:
        data.main(["--out", str(tmp_path / "d")])
    assert "python3-doc" in str(exc.value) and "--no-docs" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "d").exists()
