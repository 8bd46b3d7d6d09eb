"""The small Countdown model: tokenizer, warm-start data, evaluation numbers, and the pipeline end to end."""

import json
from dataclasses import replace

import pytest
import torch
from helpers import StopAt

from setpo.envs.countdown import CountdownInstance, score_answer
from setpo import pass_at_k
from setpo_lab.studies.countdown import (
    CountdownLMConfig,
    RLRun,
    evaluate_samples,
    load_config,
    make_data,
    train_rl,
    train_sft,
    run_study,
    sft_examples,
)
from setpo_lab.studies import countdown_data
from setpo_lab.studies.countdown_data import prompt_text, solution_key
from setpo.trl.tiny_models import ModelSize, build_tokenizer
from setpo.trl.rewards import countdown_reward


def test_tokenizer_round_trips_and_is_expression_level():
    tok = build_tokenizer()
    text = "3 7 25 50 = 82\n<answer>(50-25)*3+7</answer>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(ids)
    assert "<answer>" in pieces and "25" in pieces and "82" in pieces  # whole numbers, one token each
    assert tok.unk_token_id not in ids
    long = "12345 + 7"
    assert tok.decode(tok(long)["input_ids"]) == long  # long digit runs split into known pieces
    assert tok.convert_ids_to_tokens(tok(f"1{tok.eos_token}")["input_ids"])[-1] == tok.eos_token


def test_sft_examples_are_distinct_correct_solutions():
    insts = [CountdownInstance((2, 3, 4), 24), CountdownInstance((1, 2, 3, 4), 10)]
    ex = sft_examples(insts, solutions_per_problem=3, seed=0)
    for inst in insts:
        mine = [e["completion"] for e in ex if e["prompt"] == prompt_text(inst)]
        assert 1 <= len(mine) <= 3 and len(set(mine)) == len(mine)
        assert all(score_answer(c, inst.numbers, inst.target) == 1.0 for c in mine)
    assert len([e for e in ex if e["prompt"] == prompt_text(insts[1])]) == 3  # 1+2+3+4 has many solutions
    assert ex == sft_examples(insts, 3, seed=0)
    with pytest.raises(ValueError):
        sft_examples(insts, 0, seed=0)


def test_reward_and_solution_key():
    good, reordered = countdown_data._answer_text("2*3*4"), countdown_data._answer_text("4*(3*2)")
    assert countdown_reward([good, "<answer>2+3+4</answer>", "nothing"], numbers=[[2, 3, 4]] * 3,
                            target=[24] * 3) == [1.0, 0.1, 0.0]
    assert solution_key(good) == solution_key(reordered) is not None
    assert solution_key("no answer") is None


def test_evaluate_samples_pass_at_k_and_diversity():
    a, b = CountdownInstance((2, 3, 4), 24), CountdownInstance((1, 2, 3, 4), 10)
    answer = countdown_data._answer_text
    samples = [
        [answer("2*3*4"), answer("4*3*2"), "x", "<answer>1</answer>"],   # 2 correct, 1 mode
        [answer("1+2+3+4"), answer("2*3+4*1"), answer("4+3+2+1"), "y"],  # 3 correct, 2 modes
    ]
    r = evaluate_samples([a, b], samples)
    assert r["correct"] == [2, 3] and r["distinct"] == [1, 2]
    assert r["pass_at_k"][0] == pytest.approx((0.5 + 0.75) / 2)
    assert r["pass_at_k"][2] == pytest.approx((pass_at_k(4, 2, 3) + pass_at_k(4, 3, 3)) / 2)
    assert r["diversity_width"] == 1 and r["average_modes"] == pytest.approx(1.5)
    with pytest.raises(ValueError):
        evaluate_samples([a, b], samples[:1])


def test_config_validation_and_runs():
    cfg = CountdownLMConfig()
    search = cfg.search_runs()
    assert search[0] == cfg.paper_run() and search[0].lam == 0.5 and search[0].units == "absolute"
    assert len(search) == 1 + len(cfg.search_embedders) * len(cfg.search_lambdas)
    assert all(r.seed == cfg.rl_seeds[0] and r.group_size == 7 and r.beta == 0.001 for r in search)
    chosen = {"setpo": search[-1], **{k: runs[0] for k, runs in cfg.searches(search[-1].embedder).items()
                                      if k != "setpo"}}
    runs = cfg.final_runs(chosen)
    names = [r.name for r in runs]
    main_variants = {"GRPO", cfg.paper_run().variant, *(r.variant for r in chosen.values())}
    assert len(main_variants) == 7  # GRPO, paper, chosen SetPO, pairwise, DRA, Pass@k, ceiling
    assert len(names) == len(set(names)) == 7 * len(cfg.rl_seeds) + 2 * cfg.grid_seeds * len(cfg.other_cells)
    for seed in cfg.rl_seeds:  # every method of the main cell has every seed, so differences pair up
        assert {r.variant for r in runs if r.seed == seed and r.group_size == 7 and r.beta == 0.001} == main_variants
    assert {(g, b) for g in (3, 7) for b in (0.001, 0.005)} == {(r.group_size, r.beta) for r in runs}  # the grid
    pairwise = chosen["pairwise"]
    assert chosen["dra"].method == "DRA-GRPO" and chosen["passk"].method == "Pass@k training"
    assert chosen["ceiling"].is_ceiling and not chosen["setpo"].is_ceiling
    # T = 0.5 too for the grid's two methods, T = 1 alone for the main cell's other methods
    assert cfg.temperatures(chosen["setpo"].in_cell(3, 0.005, 1), chosen["setpo"]) == (0.5, 1.0)
    assert cfg.temperatures(cfg.main_cell().in_cell(3, 0.005, 2), chosen["setpo"]) == (0.5, 1.0)
    assert cfg.temperatures(pairwise, chosen["setpo"]) == cfg.temperatures(cfg.paper_run(), chosen["setpo"]) == (1.0,)
    assert pairwise.method == "Pairwise+GRPO" and chosen["setpo"].method == "SetPO+GRPO"
    with pytest.raises(ValueError, match="search_lambdas"):
        CountdownLMConfig(search_lambdas=(0.0,))
    with pytest.raises(ValueError, match="group sizes"):
        CountdownLMConfig(main_group_size=2)
    with pytest.raises(ValueError, match="rl_seeds"):
        CountdownLMConfig(rl_seeds=(0, 0))
    with pytest.raises(ValueError, match="preset"):
        CountdownLMConfig(extra_presets=("ppo",))


def test_selection_respects_the_pass1_floor():
    from setpo_lab.studies import countdown

    cfg = CountdownLMConfig()
    ev = lambda p1, pn: {"accuracy": p1, "pass_at_k": [p1, pn], "average_modes": 1.0}  # noqa: E731
    a, b, c = (cfg.main_cell(lam=lam, embedder="hash", units="term_std") for lam in (0.3, 1.0, 3.0))
    best, sel = countdown._select_on_validation(cfg, ev(0.30, 0.60),
                                                {a: ev(0.29, 0.62), b: ev(0.25, 0.70), c: ev(0.30, 0.62)})
    assert best == a and sel["qualified"] and not sel["candidates"][b.name]["qualifies"]  # b loses 5 points of pass@1
    best, sel = countdown._select_on_validation(cfg, ev(0.50, 0.60), {b: ev(0.25, 0.70), c: ev(0.30, 0.62)})
    assert best == b and not sel["qualified"]  # none qualifies: the best pass@n, flagged


def test_paired_differences_and_intervals():
    from setpo_lab.studies.intervals import mean_ci

    ci = mean_ci([0.1, 0.2, 0.3])
    assert ci["mean"] == pytest.approx(0.2) and ci["hi"] - ci["mean"] == pytest.approx(4.303 * 0.1 / 3 ** 0.5)
    assert mean_ci([0.5])["lo"] is None


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("countdown_smoke")
    cfg = CountdownLMConfig.smoke(out=str(out), threads=1)
    logs = []
    run_study(cfg, log=logs.append)
    return cfg, out, logs


def test_smoke_study_end_to_end(smoke_study):
    cfg, out, logs = smoke_study
    summary = json.loads((out / "results.json").read_text())
    runs = [RLRun(**r["run"]) for r in summary["runs"] if r["run"]]
    assert {r.seed for r in runs} == set(cfg.rl_seeds) and {r.method for r in runs} >= {"GRPO", "SetPO+GRPO",
                                                                                        "Pairwise+GRPO"}
    # the chosen SetPO, every seed, at every temperature
    assert sum(r["primary"] for r in summary["runs"]) == len(cfg.rl_seeds) * len(cfg.eval_temperatures)
    assert {p["variant"] for p in summary["paired"]} == {r.variant for r in runs if r.variant != "GRPO"}
    assert {v["role"] for v in summary["versus"]} - {"paper"} == {"pairwise", "dra", "passk", "ceiling"}
    assert {(c["G"], c["T"]) for c in summary["grid"]} == {(3, 0.5), (3, 1.0), (4, 0.5), (4, 1.0)}
    assert summary["noise"]["seeds"] == len(cfg.rl_seeds) and "projection" in summary["noise"]
    assert summary["timings"]["totals"]["sft"] > 0 and all(
        set(t) >= {"generation", "embedding", "update"} for t in summary["timings"]["rl"].values())
    assert all(p["passn"]["n"] == len(cfg.rl_seeds) for p in summary["paired"])
    for row in summary["runs"]:
        curve = row["pass_curve"]
        assert len(curve) == cfg.eval_samples and all(0 <= x <= 1 for x in curve)
        assert all(x <= y + 1e-12 for x, y in zip(curve, curve[1:], strict=False))  # pass@k grows with k
    assert "Paired differences against GRPO" in (out / "results.md").read_text()
    assert json.loads((out / "selection.json").read_text())["chosen"] in {r.name for r in runs}
    assert set(json.loads((out / "diagnostics.json").read_text())) == {"hash"}
    for run in runs:
        hist = json.loads((out / "rl" / run.name / "log_history.json").read_text())
        steps = [h for h in hist if "setpo/s_mean" in h]
        assert steps and all("setpo/distinct_correct" in h for h in steps)
        probes = [json.loads(x) for x in (out / "rl" / run.name / "probes.jsonl").read_text().splitlines()]
        assert {p["step"] for p in probes} == set(range(cfg.rl_steps + 1))
    assert load_config(out) == cfg
    # a second call finds everything done and only re-reads the cached evaluations
    logs2 = []
    run_study(cfg, log=logs2.append)
    assert not any(line.startswith("[sft]") or line.startswith("[rl] ") and "seed=" in line for line in logs2)
    with pytest.raises(ValueError, match="different config"):
        run_study(replace(cfg, rl_steps=3), log=lambda *_: None)


def test_rl_run_checkpoints_and_resumes(smoke_study, tmp_path):
    cfg, out, _ = smoke_study
    cfg = replace(cfg, out=str(tmp_path), rl_steps=4, rl_save_steps=2)
    data = make_data(cfg)
    run = RLRun("grpo", 3, 0.001, 0.5, embedder="hash")
    run_dir = tmp_path / run.name
    with pytest.raises(KeyboardInterrupt):
        train_rl(cfg, run, data, out / "sft" / "final", run_dir, log=lambda *_: None, callbacks=[StopAt(3)])
    assert (run_dir / "checkpoint-2").is_dir() and not (run_dir / "final").exists()
    logs = []
    final = train_rl(cfg, run, data, out / "sft" / "final", run_dir, log=logs.append)
    assert any("resuming from checkpoint-2" in line for line in logs)
    assert any("step 4/4" in line for line in logs)  # the progress line at the last step
    hist = json.loads((run_dir / "log_history.json").read_text())
    assert max(h.get("step", 0) for h in hist) == 4
    assert json.loads((final / "done.json").read_text())["run"]["lam"] == 0.5
    assert not list(run_dir.glob("checkpoint-*"))  # cleaned once final is written
    probes = [json.loads(x)["step"] for x in (run_dir / "probes.jsonl").read_text().splitlines()]
    assert sorted(set(probes)) == [0, 1, 2, 3, 4] and len(probes) == 5 * cfg.probe_samples * cfg.n_probe


def test_save_steps_must_fall_on_generation_boundaries():
    with pytest.raises(ValueError, match="rl_save_steps must be a multiple of 2"):
        CountdownLMConfig.smoke(rl_save_steps=3)
    with pytest.raises(ValueError, match="rl_prompts_per_step"):
        CountdownLMConfig.smoke(rl_prompts_per_step=3)


def test_config_types_are_checked_up_front():
    for bad, field in [(dict(rl_steps="abc"), "rl_steps"), (dict(sft_lr="x"), "sft_lr"), (dict(rl_steps=0), "rl_steps"),
                       (dict(rl_seeds=[0, "1"]), "rl_seeds"), (dict(eval_top_p=0), "eval_top_p"),
                       (dict(model={"hidden": 3}), "model"), (dict(main_beta=float("nan")), "beta")]:
        with pytest.raises(ValueError, match=field):
            CountdownLMConfig.smoke(**bad)


def test_sft_warm_start_learns_the_format(tmp_path):
    """A few hundred SFT steps on a tiny model: the answer format comes out, and loss goes down."""
    cfg = CountdownLMConfig.smoke(out=str(tmp_path), n_train=200, sft_epochs=4.0, sft_batch_size=32, sft_lr=5e-3,
                                  model=ModelSize(64, 1, 2, 1, 128, 48), threads=1)
    data = make_data(cfg)
    final = train_sft(cfg, data, tmp_path / "sft", log=lambda *_: None)
    hist = json.loads((tmp_path / "sft" / "log_history.json").read_text())
    losses = [h["loss"] for h in hist if "loss" in h]
    assert losses[-1] < 0.5 * losses[0]
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from setpo_lab.studies.sampling import sample_completions

    tok = PreTrainedTokenizerFast.from_pretrained(str(final))
    model = AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32)
    samples = sample_completions(model, tok, [prompt_text(i) for i in data.test], 8, temperature=0.5)
    formatted = sum(score_answer(s, i.numbers, i.target) > 0
                    for i, row in zip(data.test, samples, strict=True) for s in row)
    assert formatted >= 0.5 * 8 * len(data.test)  # most samples are <answer>...</answer>


def test_the_validation_search_has_seeds_of_its_own():
    """The seeds that choose are not the seeds that report, and a search model is never needed for the test split
    (so no model must be restored across sittings but one killed between its training and its evaluations)."""
    cfg = CountdownLMConfig(out="runs/never")
    assert cfg.search_seed_list == (1000, 1001)
    finals = {r.seed for r in cfg.final_runs({"setpo": cfg.paper_run(), "pairwise": cfg.main_cell(),
                                              "dra": cfg.main_cell(), "passk": cfg.main_cell(),
                                              "ceiling": cfg.main_cell()})}
    assert finals == set(cfg.rl_seeds) and not finals & set(cfg.search_seed_list)
    with pytest.raises(ValueError, match=r"must not use the validation search's seeds .*\[1000\]"):
        CountdownLMConfig(out="runs/never", rl_seeds=(0, 1, 2, 1000))
    with pytest.raises(ValueError, match="must not use the validation search's seeds"):
        CountdownLMConfig(out="runs/never", headline_seeds=(1001,))


def test_the_record_names_the_command_that_makes_its_config(monkeypatch):
    """The record's command, parsed back, is the study's config, headline seeds included (make countdown grows
    them with --set), so that running what the record says makes that study and not a smaller one."""
    from setpo_lab.repro.arithmetic import PINNED_ARITHMETIC
    from setpo_lab.studies.arguments import parse_study_args
    from setpo_lab.studies.countdown import COMMAND
    from setpo_lab.studies.countdown_results import study_command

    for name, value in PINNED_ARITHMETIC.items():
        monkeypatch.setenv(name, value)
    for seeds in ((), (5, 6, 11)):
        command = study_command("runs/somewhere", smoke=False, headline_seeds=seeds)
        study = command.split(", then ")[0].replace("python -m setpo_lab.cli countdown ", "")
        cfg, _, _ = parse_study_args(COMMAND, [a.strip("'") for a in study.split()])
        assert cfg == CountdownLMConfig(out="runs/somewhere", headline_seeds=seeds)
    from setpo_lab import ROOT

    # notebook 03 runs in notebooks/ and names the folder from there; the record names it from the root
    assert " --out results/countdown," in study_command(str(ROOT / "notebooks" / ".." / "results" / "countdown"), False)
