"""Math data: reading the public layouts from local files, the Qwen-Math template, the math-verify reward."""

import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from setpo.envs import math as md
from setpo_lab.studies import math as ml
from setpo_lab.studies import math_results as mr
from setpo_lab.studies.figures import (hover_text, models_pass_at_k_figure, probe_trajectory_figure, read_probes,
                                       trainer_log_figure)
from setpo.trl.tiny_models import build_chat_tokenizer
from setpo.trl.rewards import math_reward_func


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_jsonl_answers_after_hashes_without_commas(tmp_path):
    f = _write_jsonl(tmp_path / "gsm8k_train.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A car costs $1,200 more than...", "answer": "work...\n#### 1,200"},
    ])
    problems = md.load_math_problems(f)
    assert [p.answer for p in problems] == ["7", "1200"]
    assert problems[0].question.startswith("Tom has 3 apples")
    assert problems[0].source == "gsm8k_train"  # the file's stem when there is no data_source column
    assert [p.id for p in problems] == ["0", "1"]


def test_math500_parquet_uses_answer_and_falls_back_to_the_boxed_solution(tmp_path):
    f = tmp_path / "math500.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "solution": "... $\\boxed{\\frac{3}{4}}$",
         "answer": "\\frac{3}{4}", "unique_id": "test/algebra/1.json"},
        {"problem": "What is $\\sqrt{52}$?", "solution": "We get \\boxed{2\\sqrt{13}}.", "answer": None,
         "unique_id": "test/algebra/2.json"},
    ]), f)
    problems = md.load_math_problems(f, source="math500")
    assert [p.answer for p in problems] == ["\\frac{3}{4}", "2\\sqrt{13}"]
    assert [p.id for p in problems] == ["test/algebra/1.json", "test/algebra/2.json"]
    assert {p.source for p in problems} == {"math500"}


def test_aime_and_amc_layouts_with_numeric_answers(tmp_path):
    aime = _write_jsonl(tmp_path / "aime24.jsonl", [{"ID": "2024-I-1", "Problem": "Find x.", "Answer": 204}])
    amc = tmp_path / "amc.json"
    amc.write_text(json.dumps([{"problem": "Find y.", "answer": 142.0}, {"problem": "Find z.", "answer": 0.5}]))
    assert md.load_math_problems(aime)[0] == md.MathProblem("Find x.", "204", "aime24", "2024-I-1")
    assert [p.answer for p in md.load_math_problems(amc)] == ["142", "0.5"]


def test_verl_parquet_round_trip_keeps_question_answer_and_template(tmp_path):
    problems = md.smoke_problems(5, seed=3)
    out = md.write_verl_parquet(problems, tmp_path / "sub" / "train.parquet", split="train")
    assert md.is_verl_parquet(out)
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["prompt"] == md.qwen_math_messages(problems[0].question)
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": problems[0].answer}
    assert rows[0]["ability"] == "math" and rows[0]["data_source"] == md.SMOKE_SOURCE
    back = md.load_math_problems(out)
    assert [(p.question, p.answer) for p in back] == [(p.question, p.answer) for p in problems]


def test_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="TRAIN_FILE") as err:
        md.load_math_problems(tmp_path / "nope.parquet")
    assert "python -m setpo.envs.math smoke" in str(err.value)


@pytest.mark.parametrize("rows, match", [
    ([{"text": "no question column"}], "question columns"),
    ([{"question": "q", "solution": "no boxed answer here"}], "no answer column"),
    ([{"question": "q", "answer": "   "}], "empty answer"),
])
def test_unreadable_rows_name_the_row(tmp_path, rows, match):
    f = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "fine", "answer": "1"}] + rows)
    with pytest.raises(ValueError, match=f"row 1: .*{match}"):
        md.load_math_problems(f)


def test_bad_file_types_and_json_lines(tmp_path):
    (tmp_path / "x.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        md.load_math_problems(tmp_path / "x.csv")
    (tmp_path / "y.jsonl").write_text('{"question": "a", "answer": "1"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        md.load_math_problems(tmp_path / "y.jsonl")


def test_template_is_qwen_math_chatml():
    q = "What is 2+3?"
    assert md.qwen_math_messages(q) == [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": q},
    ]
    assert md.qwen_math_prompt(q) == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")


def test_template_matches_a_qwen2_chat_template_rendering():
    """The ChatML string equals what a Qwen2-style Jinja chat template renders from the messages."""
    from jinja2 import Template

    qwen2_template = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
                      "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
                      "{{ '<|im_start|>assistant\n' }}{% endif %}")
    q = "Find $x$ if $2x = 6$."
    rendered = Template(qwen2_template).render(messages=md.qwen_math_messages(q), add_generation_prompt=True)
    assert rendered == md.qwen_math_prompt(q)


@pytest.mark.parametrize("completion, answer, expected", [
    ("Adding, 3+4 = 7, so the answer is \\boxed{7}.", "7", 1.0),
    ("so \\boxed{8}", "7", 0.0),
    ("\\boxed{1,200}", "1200", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac12}", "0.5", 1.0),
    ("$2\\sqrt{13}$", "2\\sqrt{13}", 1.0),
    ("first \\boxed{3} then, correcting myself, \\boxed{4}", "4", 1.0),
    ("The answer is 7", "7", 1.0),        # a stated answer counts without a box (setpo.envs.math_answers: real responses)
    ("7 apples in all", "7", 0.0),        # no box, no stated answer: not "the last number in the text"
    ("\\boxed{__import__('os')}", "7", 0.0),  # nonsense is a wrong answer, never executed
    ("", "7", 0.0),
])
def test_math_reward(completion, answer, expected):
    assert md.math_reward(completion, answer) == expected


def test_reward_works_off_the_main_thread_as_in_verl_reward_workers():
    out = []
    t = threading.Thread(target=lambda: out.append(md.verl_compute_score("gsm8k", "\\boxed{12}", "12")))
    t.start()
    t.join()
    assert out == [1.0]


def test_trl_reward_func_reads_chat_and_plain_completions():
    completions = ["\\boxed{5}", [{"role": "assistant", "content": "it is \\boxed{6}"}], "\\boxed{1}"]
    assert math_reward_func(completions, answer=["5", "6", "2"], prompts=None) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="one value per completion"):
        math_reward_func(completions, answer=["5", "6"])


def test_extract_boxed_matches_nested_braces_and_rejects_truncation():
    assert md.extract_boxed("x \\boxed{\\frac{a}{b}} y") == "\\frac{a}{b}"
    assert md.extract_boxed("\\boxed{1} and \\fbox{2}") == "2"
    assert md.extract_boxed("\\boxed{\\frac{1}{2") is None
    assert md.extract_boxed("nothing") is None


def test_smoke_problems_are_reproducible_and_their_answers_verify():
    a, b = md.smoke_problems(40, seed=7), md.smoke_problems(40, seed=7)
    assert a == b and a != md.smoke_problems(40, seed=8)
    assert len({p.question for p in a}) > 30  # varied, not one template repeated
    for p in a:
        assert int(p.answer) >= 0
        assert md.math_reward(f"... so \\boxed{{{p.answer}}}", p.answer) == 1.0
        assert md.math_reward(f"\\boxed{{{int(p.answer) + 1}}}", p.answer) == 0.0


def test_smoke_files_read_back_through_the_gsm8k_path(tmp_path):
    train, val = md.write_smoke_files(tmp_path, n_train=12, n_val=4, seed=1)
    tr, va = md.load_math_problems(train), md.load_math_problems(val)
    assert [p.answer for p in tr] == [p.answer for p in md.smoke_problems(12, seed=1)]
    assert len(va) == 4 and tr[0].source == md.SMOKE_SOURCE


def test_to_trl_records():
    recs = md.to_trl_records(md.smoke_problems(2), chat=False)
    assert recs[0]["prompt"].startswith("<|im_start|>system") and recs[0]["answer"] == md.smoke_problems(2)[0].answer
    assert md.to_trl_records(md.smoke_problems(1))[0]["prompt"][1]["role"] == "user"


def test_cli_prepare_and_smoke(tmp_path, capsys):
    md.main(["smoke", str(tmp_path / "d"), "--n-train", "6", "--n-val", "3"])
    md.main(["prepare", str(tmp_path / "d" / "train.jsonl"), str(tmp_path / "out.parquet"), "--source", "s"])
    assert "(6 problems)" in capsys.readouterr().out
    assert {p.source for p in md.load_math_problems(tmp_path / "out.parquet")} == {"s"}


# --------------------------------------------------------------------------------- the TRL driver (notebook 06)


def test_chat_tokenizer_round_trips_and_renders_the_template():
    tok = build_chat_tokenizer()
    text = md.qwen_math_prompt("What is 2+3? Answer in \\boxed{}.")
    assert tok.decode(tok(text)["input_ids"]) == text
    rendered = tok.apply_chat_template(md.qwen_math_messages("What is 2+3?"), tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == md.qwen_math_prompt("What is 2+3?")
    assert tok.convert_ids_to_tokens(tok(rendered)["input_ids"][:1]) == ["<|im_start|>"]


class _Crash(Exception):
    pass


def test_train_resume_evaluate_and_trajectories_on_cpu(tmp_path):
    """The notebook's path at smoke size: a run crashes after its first checkpoint, a rerun resumes from it;
    evaluation and the trajectory figure read what the runs wrote."""
    import torch
    from transformers import TrainerCallback

    from setpo.embed import HashedNgramEmbedder

    torch.set_num_threads(1)

    class CrashAfterFirstSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            raise _Crash(state.global_step)

    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path / "run"))
    train, val = ml.load_study_problems(cfg)
    probes = val[:cfg.n_probe]
    emb = HashedNgramEmbedder()
    with pytest.raises(_Crash):
        ml._train_rl(cfg, "SetPO+GRPO", 0.05, train, probes, embedder=emb, callbacks=[CrashAfterFirstSave()])
    run_dir = tmp_path / "run" / "SetPO_GRPO"
    assert (run_dir / "checkpoint-1").is_dir() and not (run_dir / "final").exists()
    logs = []
    final = ml._train_rl(cfg, "SetPO+GRPO", 0.05, train, probes, embedder=emb, log=logs.append)
    assert "resuming from checkpoint-1" in logs[0]
    assert json.loads((final / "done.json").read_text())["steps"] == 2
    assert json.loads((run_dir / "run_config.json").read_text())["lambda"] == 0.05
    history = json.loads((run_dir / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [1, 2]  # step 1's log came back with the checkpoint
    assert any("setpo/s_mean" in h for h in history)
    records = read_probes(run_dir / "probes.jsonl")
    assert sorted({r["step"] for r in records}) == [0, 1, 2]  # the resumed run did not sample step 0 or 1 again
    assert len(records) == 3 * cfg.n_probe * cfg.probe_samples
    n_logs = len(logs)  # a finished run is returned as is: nothing trained, nothing logged
    assert ml._train_rl(cfg, "SetPO+GRPO", 0.05, train, probes, log=logs.append) == final and len(logs) == n_logs

    result = ml.evaluate_avg_at_k(cfg, final, val, cache=tmp_path / "eval.json")
    assert result["k"] == cfg.eval_k and result["n_problems"] == cfg.eval_limit
    assert 0.0 <= result["avg_at_k"] <= 1.0 and len(result["pass_at_k"]) == cfg.eval_k
    assert ml.evaluate_avg_at_k(cfg, "/nonexistent", val, cache=tmp_path / "eval.json") == result  # cached

    fig, data = probe_trajectory_figure({"SetPO+GRPO": records}, emb, method="pca")
    hover = [cd[2] for trace in fig.data for cd in trace.customdata]
    assert len(hover) == len(records) and data["steps"] == [0, 1, 2]
    assert hover_text(records[0]["text"]) in hover


def test_run_config_checks_and_presets():
    cfg = ml.MathRunConfig(algo="dapo")
    assert cfg.runs() == {"DAPO": (0.0, "absolute"), "SetPO+DAPO": (0.2, "absolute")}
    args = ml._trl_args(ml.MathRunConfig(algo="gspo", use_vllm=False), 0.1, "/tmp/x")
    assert args.importance_sampling_level == "sequence" and args.setpo_lambda == 0.1
    assert args.setpo_lambda_units == "absolute"
    assert ml._trl_args(ml.MathRunConfig(use_vllm=False), 0.15, "/tmp/x", "term_std").setpo_lambda_units == "term_std"
    # the CPU setting: a third run at a λ in units of the term's spread, folders and files named without spaces
    real = ml.MathRunConfig.cpu_real()
    assert real.runs() == {"GRPO": (0.0, "absolute"), "SetPO+GRPO": (0.05, "absolute"),
                           "SetPO+GRPO λ=0.15σ": (0.15, "term_std")}
    assert [ml._folder_name(label) for label in real.runs()] == ["GRPO", "SetPO_GRPO", "SetPO_GRPO_lam0.15sd"]
    assert real.shares_samples() and not real.tiny and ml._eval_file(real, "GRPO") == ml._passk_file(real, "GRPO")
    assert not ml.MathRunConfig.cpu_demo().shares_samples() and ml.MathRunConfig.cpu_demo().tiny
    with pytest.raises(ValueError, match="alt_lam_units must be one of"):
        ml.MathRunConfig(alt_lam=0.1, alt_lam_units="sigma")
    with pytest.raises(ValueError, match="alt_lam must be > 0"):
        ml.MathRunConfig(alt_lam=0.0)
    assert (args.num_generations, args.temperature, args.max_completion_length, args.beta) == (6, 0.9, 756, 1e-4)
    # one generation batch of 64 prompts x 6 completions = one optimizer step
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64 * 6
    assert args.lr_scheduler_type == "constant"
    with pytest.raises(ValueError, match="num_generations must be a whole number >= 3"):
        ml.MathRunConfig(num_generations=2)
    with pytest.raises(ValueError, match="multiple of micro_batch"):
        ml.MathRunConfig(prompts_per_step=3, micro_batch=4)
    with pytest.raises(FileNotFoundError, match="MODEL_PATH"):
        ml.resolve_model_path(ml.MathRunConfig(model_path="/no/such/model"))


def test_vllm_work_goes_to_fresh_processes(monkeypatch):
    assert ml._in_fresh_process(md.math_reward, "so \\boxed{3}", "3") == 1.0  # a real spawned process
    calls = []
    monkeypatch.setattr(ml, "_in_fresh_process", lambda fn, *args, **kw: calls.append((fn.__name__, args[1])) or args[1])
    cfg = ml.MathRunConfig(use_vllm=True, algo="gspo")
    assert ml.train_runs(cfg, [], [], log=lambda *_: None) == {"GSPO": "GSPO", "SetPO+GSPO": "SetPO+GSPO"}
    assert calls == [("_train_rl", "GSPO"), ("_train_rl", "SetPO+GSPO")]


def test_the_trainer_log_figure_draws_each_runs_logged_steps(tmp_path):
    """Any run's log_history.json (SetPOTrainer's): a panel per logged metric, a line per run at the steps that
    logged it (a step without the key, like the trainer's final summary, is left out)."""
    runs = {}
    for name, offset in (("GRPO", 0), ("SetPO+GRPO", 10)):
        folder = tmp_path / name
        folder.mkdir()
        history = [{"step": s, "reward": offset + s, "setpo/pairwise_similarity": 0.9 - s / 100} for s in (1, 2, 3)]
        (folder / "log_history.json").write_text(json.dumps([*history, {"step": 3, "train_runtime": 9.0}]))
        runs[name] = folder
    fig = trainer_log_figure(runs, title="t")
    reward = [t for t in fig.data if list(t.y) in ([1, 2, 3], [11, 12, 13])]
    assert [t.name for t in reward] == ["GRPO", "SetPO+GRPO"] and [list(t.x) for t in reward] == [[1, 2, 3]] * 2
    assert not any("distinct" in (t.name or "") for t in fig.data)  # never logged: no line


def test_pass_at_k_curves_table_and_figure():
    """The large-budget comparison of notebook 06: one curve per model from its pass@k list, the base model
    dashed grey, powers of two marked on a log axis, and a table at the k that were sampled."""
    results = {name: {"pass_at_k": [min(1.0, p * k) for k in range(1, 17)], "n_problems": 30}
               for name, p in (("base model", 0.02), ("GRPO", 0.05), ("SetPO+GRPO", 0.04))}
    fig = models_pass_at_k_figure(results, title="t")
    names = [t.name for t in fig.data]
    assert names == ["base model", "GRPO", "SetPO+GRPO"]
    assert fig.data[0].line.dash == "dash" and list(fig.data[1].x) == list(range(1, 17))
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8, 16] and fig.layout.xaxis.type == "log"
    table = mr.pass_at_k_table(results)
    assert "pass@1 | pass@4 | pass@16 |" in table and "pass@64" not in table and "| GRPO | 5.0 | 20.0 | 80.0 |" in table


def test_pass_at_k_problems_and_settings():
    from setpo_lab.studies import math as ml

    cfg = ml.MathRunConfig.cpu_demo(smoke=True)
    assert cfg.passk_max == 4 and len(ml.load_passk_problems(cfg)) == 2
    assert ml.MathRunConfig().passk_max == 256
    with pytest.raises(ValueError, match="passk_max"):
        ml.MathRunConfig(passk_max=0)
