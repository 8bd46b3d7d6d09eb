"""The extended short-answer study end to end on a tiny model (its smoke preset), its reuse of the committed
study's runs, and its report's statistics against independently computed values."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from setpo.metrics import pass_at_k
from setpo_lab.studies.short_answers_config import ARMS, CureStudyConfig, ShortAnswerStudyConfig
from setpo_lab.studies.short_answers import run_study
from setpo_lab.studies.intervals import BOOTSTRAP_SEED, paired_bootstrap
from setpo_lab.studies import short_answers_cure_results
from setpo_lab.studies.short_answers_cure_results import cure_reading


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from setpo.trl.tiny_models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def cure(tiny_model, tmp_path_factory):
    cfg = CureStudyConfig.preset("smoke", run_dir=str(tmp_path_factory.mktemp("cure") / "c"), model_path=tiny_model)
    lines = []
    return cfg, run_study(cfg, log=lines.append), lines


def test_smoke_cure_study_trains_every_arm_with_its_settings(cure):
    cfg, result, _ = cure
    assert set(result.runs) == {f"{a}_s{s}" for a in cfg.arms for s in cfg.seeds}
    root = Path(cfg.run_dir)
    for label in result.runs:
        args = json.loads((root / "train" / label / "final" / "done.json").read_text())
        assert args["label"] == label
    # each arm's trainer got its own settings: the gated answer-key arm logs its monitor, pass@k its estimator
    history = json.loads((root / "train" / "key_gated_s0" / "log_history.json").read_text())
    assert any("setpo/s_length_corr" in h for h in history)
    assert {p.stem for p in (root / "eval_hard").glob("*.json")} == {
        "base", *(label for label in result.runs if label.split("_s")[0] in cfg.hard_arms)}
    hard = json.loads((root / "eval_hard" / "base.json").read_text())
    assert hard["task_ids"] == [t.task_id for t in cfg.hard_tasks()] and len(hard["answers"][0]) == cfg.hard_n
    assert hard["model"] == Path(cfg.model_path).name and len(hard["model_identity"]) == 64


def test_the_report_counts_its_comparisons_and_matches_per_prompt_values(cure):
    cfg, result, _ = cure
    rep = result.summary
    methods = list(cfg.methods())
    # every arm against GRPO (but GRPO itself) and against the base model, on every metric, plus pass@k_max
    per_metric = (len(methods) - 1) + len(methods)
    assert len([c for c in rep["comparisons"] if "pass@k prompts" not in c["metric"]]) == per_metric * 8
    assert f"{len(rep['comparisons'])} comparisons" in rep["reading"]
    # a comparison's per-seed values are the per-seed differences of the per-prompt means
    c = next(c for c in rep["comparisons"] if c["metric"] == "length" and c["a"] == "Pass@k Training"
             and c["b"] == "GRPO")
    for seed, value in zip(cfg.seeds, c["per_seed"], strict=True):
        a = json.loads((Path(cfg.run_dir) / "eval" / f"passk_s{seed}.json").read_text())
        b = json.loads((Path(cfg.run_dir) / "eval" / f"grpo_s{seed}.json").read_text())
        mean = lambda e: np.mean([np.mean([len(t) for t in row]) for row in e["texts"]])  # noqa: E731
        assert value == pytest.approx(mean(a) - mean(b))
    assert "not corrected for their number" in rep["reading"]
    assert "pilot_choice" not in rep  # only a pilot (a λ grid) chooses
    assert json.loads((Path(cfg.run_dir) / "results.json").read_text())["reading"] == rep["reading"]


def test_the_records_figures_draw_every_arm_and_the_guesser_from_its_numbers(cure):
    """Notebook 04's figures of a cure record: the training figure has one mean line per arm in each panel, its
    reward the mean over seeds of each run's logged reward; the pass@k figure has the base model, the guesser and
    every arm evaluated on the harder prompts, each line the record's curve."""
    from setpo_lab.studies.short_answers_cure_results import arms_training_figure, hard_pass_at_k_figure

    cfg, result, _ = cure
    rec = json.loads((Path(cfg.run_dir) / "results.json").read_text())
    fig = arms_training_figure(rec)
    methods = list(cfg.methods())
    reward = [t for t in fig.data if t.name in methods and t.xaxis in ("x", None) and t.line.dash in (None, "solid")]
    assert [t.name for t in reward] == methods
    for trace in reward:
        runs = [rec["runs"][label] for label, (m, _) in cfg.run_labels().items() if m == trace.name]
        assert list(trace.y) == pytest.approx(np.mean([r["reward"] for r in runs], axis=0))
    passk = hard_pass_at_k_figure(rec)
    curves = rec["hard"]["curves"]
    drawn = {t.name: list(t.y) for t in passk.data if t.name}
    assert set(drawn) == {"base model", "guessing from the base model's answers",
                          *(m for m in methods if cfg.arm_of(m) in cfg.hard_arms)}
    assert drawn["guessing from the base model's answers"] == pytest.approx([curves["guessing"][str(k)]
                                                                             for k in rec["hard"]["k"]])
    assert hard_pass_at_k_figure({**rec, "hard": {}}) is None


def test_a_rerun_of_one_new_arms_run_reproduces_its_record(cure, tiny_model, capsys):
    """``--rerun LABEL`` trains a recorded run of the cure study again in a scratch folder: on one machine it
    comes back bit for bit (exit status 0), and a run the study does not have is refused by name."""
    from setpo_lab.studies.arguments import run_command
    from setpo_lab.studies.short_answers_cure import COMMAND

    cfg, _, _ = cure
    args = ["--preset", "smoke", "--out", cfg.run_dir, "--model-path", tiny_model]
    assert run_command(COMMAND, [*args, "--rerun", "key_gated_s0"]) == 0
    assert "weights identical (SHA-256)" in capsys.readouterr().out
    assert run_command(COMMAND, [*args, "--rerun", "key_s0"]) == 1
    assert "unknown run 'key_s0'" in capsys.readouterr().err


def test_paired_bootstrap_interval_holds_its_mean_and_stays_in_range():
    rng = np.random.default_rng(1)
    a, b = rng.random((5, 30)), rng.random((5, 30))
    d = paired_bootstrap(a, b, resamples=200)
    assert d["mean"] == pytest.approx(float((a - b).mean()))
    # the interval recomputed by its definition, in plain Python: the same draws of seeds (rows) and prompts
    # (columns), each resample's mean of a − b over the drawn cells, the 2.5th and 97.5th percentiles
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    rows, cols = rng.integers(0, 5, size=(200, 5)), rng.integers(0, 30, size=(200, 30))
    means = sorted(sum(a[i, j] - b[i, j] for i in r for j in c) / (5 * 30) for r, c in zip(rows, cols, strict=True))
    assert (d["lo"], d["hi"]) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])), abs=1e-12)
    assert -1 <= d["lo"] and d["hi"] <= 1
    assert d["per_seed"] == pytest.approx(list((a - b).mean(axis=1)))
    # values in [0, 1] on both sides: the interval of a share stays inside [-1, 1]; against one base row
    share = paired_bootstrap(np.ones((5, 3)), np.zeros((1, 3)))
    assert (share["mean"], share["lo"], share["hi"]) == (1.0, 1.0, 1.0)
    assert paired_bootstrap(np.full((2, 2), np.nan), np.zeros((2, 2)))["mean"] is None


def test_prompt_metrics_and_the_guesser_against_hand_counts():
    evaluation = {"task_ids": ["between:11:21", "add_1x1:2:2"], "similarity": [0.5, None],
                  "answers": [[11, 11, 25, None], [4, 5, 4, 4]],
                  "texts": [["Answer: 11", "Answer: 11\nmore", "Answer: 25", "no"], ["Answer: 4"] * 4]}

    class Flat:  # every answer line alike
        def __call__(self, texts):
            import torch
            return torch.ones(len(texts), 2)

    m = short_answers_cure_results._prompt_metrics(evaluation, Flat())
    assert m["distinct_right"] == [1, None] and m["distinct_all"] == [2, None]
    assert m["answer_entropy"][0] == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    assert m["pass@1"] == [None, 0.75] and m["after_answer"] == [0.25, 0.0]
    assert m["answer_similarity"] == [pytest.approx(1.0), pytest.approx(1.0)]
    # the guesser: 3 of the 4 pooled add_1x1 answers are 4, so q = 3/4 and pass@2 = 1 - (1/4)^2
    g = short_answers_cure_results._guessing_pass_at_k(evaluation, [1, 2])
    assert g[1][1] == pytest.approx(0.75) and g[2][1] == pytest.approx(1 - 0.25 ** 2)
    assert pass_at_k(4, 3, 1) == pytest.approx(0.75)


def test_reuse_needs_the_same_training_settings(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    saved = ShortAnswerStudyConfig()
    (study / "config.json").write_text(json.dumps(
        {k: list(v) if isinstance(v, tuple) else v for k, v in saved.__dict__.items()}))
    CureStudyConfig(reuse_from=str(study)).check_reusable()
    with pytest.raises(ValueError, match=r"other settings \(lr\).*study/config\.json"):
        CureStudyConfig(reuse_from=str(study), lr=1e-4).check_reusable()
    cfg = CureStudyConfig(reuse_from=str(study))
    assert cfg.reused_folder("grpo_s0") == str(study) and cfg.reused_folder("key_s0") is None
    assert cfg.reused_folder("base") == str(study)


def test_presets_and_arms():
    assert CureStudyConfig.preset("cure").command() == "python -m setpo_lab run short_answers_cure --preset cure " \
                                                     "--out runs/short_answers_cure"
    pilot = CureStudyConfig.preset("pilot")
    assert pilot.eval_split == "val" and all(ARMS[a].lam_field or a == "grpo" for a in pilot.arms)
    assert "key_gated0.5_s0" in pilot.run_labels()
    assert pilot.trainer_settings("SetPO, answer key, right only λ=0.5")["setpo_gate_reward"] == 1.0
    assert set(CureStudyConfig.preset("pilot_answer").run_labels()) == {"grpo_s0", "answer0.02_s0", "answer0.05_s0"}
    notebook = CureStudyConfig.preset("notebook")  # notebook 04's own run: the study's notebook size, two arms
    assert set(notebook.run_labels()) == {"grpo_s0", "grpo_s1", "key_gated_s0", "key_gated_s1"}
    assert (notebook.steps, notebook.eval_n, notebook.hard_kinds, notebook.reuse_from) == (20, 32, (), None)
    with pytest.raises(ValueError, match="unknown arms"):
        CureStudyConfig(arms=("grpo", "nope"))
    with pytest.raises(ValueError, match="never train"):
        replace(pilot, eval_split="train")


def test_pilot_choice_takes_the_most_distinct_right_answers_within_pass_at_1_tolerance():
    from setpo_lab.studies import short_answers_cure_results

    cfg = CureStudyConfig.preset("pilot")
    means = {"GRPO": {"pass@1": 0.70, "distinct_right": 3.0}, "base model": {"pass@1": 0.2, "distinct_right": 6.0}}
    values = {("answer", 0.15): (0.69, 3.5), ("answer", 0.5): (0.60, 5.0),   # 0.5 is too far below GRPO's pass@1
              ("key", 0.15): (0.68, 3.2), ("key", 0.5): (0.66, 4.1),
              ("key_gated", 0.15): (0.50, 4.0), ("key_gated", 0.5): (0.40, 4.5)}
    for (arm, lam), (p1, d) in values.items():
        means[cfg.method_name(arm, lam)] = {"pass@1": p1, "distinct_right": d}
    assert short_answers_cure_results._pilot_choice({"means": means}, cfg) == {
        "answer": 0.15, "key": 0.5, "key_gated": None}


def test_the_reading_names_which_half_of_the_rule_fails():
    """Distinct right answers above 0 (or below) and pass@1 within 0.05 of GRPO's (the interval's low end): each
    arm's line says which of the two its intervals show."""
    def diff(metric, a, mean, lo, hi):
        return {"metric": metric, "a": a, "b": "GRPO", "mean": mean, "lo": lo, "hi": hi}

    arms = {"both": ((2.0, 0.5, 3.5), (0.01, -0.04, 0.06)), "more only": ((2.0, 0.4, 3.7), (0.02, -0.09, 0.12)),
            "within only": ((0.2, -0.4, 0.7), (-0.01, -0.03, 0.02)), "neither": ((0.5, -0.4, 1.6), (-0.08, -0.2, 0.05)),
            "fewer": ((-1.0, -1.9, -0.1), (-0.01, -0.03, 0.02))}
    record = {"means": {"base model": {}, "GRPO": {}, **{m: {} for m in arms}},
              "comparisons": [c for m, (d, p) in arms.items()
                              for c in (diff("distinct_right", m, *d), diff("pass@1", m, *p))]}
    lines = {line.split("**")[1]: line for line in cure_reading(record).splitlines() if line.startswith("- **")}
    assert lines["both"].endswith("keeps more right answers at a pass@1 within 0.05 of GRPO's.")
    assert "keeps more distinct right answers (interval above 0), but its pass@1 is not shown" in lines["more only"]
    assert lines["within only"].endswith("does not keep detectably more distinct right answers (its interval reaches 0).")
    assert lines["neither"].endswith("(its interval reaches 0), and its pass@1 is not shown to be within 0.05 of GRPO's.")
    # an interval wholly below 0 is fewer right answers, not one that "reaches 0" (the pilots' reading said so)
    assert lines["fewer"].endswith("keeps fewer distinct right answers (interval below 0).")
    assert "2 comparisons" not in cure_reading(record) and "10 comparisons" in cure_reading(record)
