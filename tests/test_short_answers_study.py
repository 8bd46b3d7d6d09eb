"""The short-answer study end to end on a tiny model (its smoke preset), and its report's arithmetic."""

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import scipy.stats

from setpo_lab.studies.arguments import run_command
from setpo_lab.studies.short_answers import COMMAND, STAGES, run_study
from setpo_lab.studies.short_answers_config import ShortAnswerStudyConfig
from setpo_lab.studies import short_answers_results
from setpo_lab.studies.figures import powers_of_two
from setpo_lab.studies.short_answers_results import reading, results_markdown


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from setpo.trl.tiny_models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory):
    cfg = ShortAnswerStudyConfig.preset("smoke", run_dir=str(tmp_path_factory.mktemp("study") / "s"),
                                        model_path=tiny_model)
    lines = []
    return cfg, run_study(cfg, log=lines.append), lines


def test_smoke_study_trains_evaluates_and_reports_every_paired_run(study):
    cfg, result, lines = study
    assert result.study == "short_answers" and result.out == Path(cfg.run_dir)
    assert set(result.runs) == {"grpo_s0", "setpo_s0", "grpo_s1", "setpo_s1"}
    assert {p.stem for p in (Path(cfg.run_dir) / "eval").glob("*.json")} == {"base", *result.runs}
    rep = result.summary
    assert rep["command"] == f"python -m setpo_lab run short_answers --preset smoke --out {cfg.run_dir} " \
                             f"--model-path {cfg.model_path}"
    for label, run in rep["runs"].items():
        assert run["step"] == [1, 2], label  # every optimizer step logged a reward
        assert run["probe_step"] == [0, 1, 2]  # probed before training, every step, and at the end
    paired = {(p["metric"], p["a"], p["b"]): p for p in rep["paired"]}
    d = paired[("reward", "SetPO+GRPO", "GRPO")]
    models = rep["models"]  # each per-seed value against the per-model metrics; the interval from scipy's t
    assert d["per_seed"] == [models[f"setpo_s{s}"]["reward"] - models[f"grpo_s{s}"]["reward"] for s in cfg.seeds]
    half = scipy.stats.t.ppf(0.975, 1) * statistics.stdev(d["per_seed"]) / math.sqrt(2)
    assert d["n"] == 2 and d["mean"] == pytest.approx(statistics.mean(d["per_seed"]))
    assert (d["lo"], d["hi"]) == pytest.approx((d["mean"] - half, d["mean"] + half), abs=1e-9)
    saved = json.loads((Path(cfg.run_dir) / "results.json").read_text())
    assert saved["paired"] == json.loads(json.dumps(rep["paired"]))
    assert ShortAnswerStudyConfig.from_record(saved["config"]) == cfg
    assert any("[grpo_s0]" in line for line in lines)


def test_a_second_call_reuses_every_piece(study):
    cfg, result, _ = study
    done = {label: (Path(final) / "done.json").read_text() for label, final in result.runs.items()}
    evals = {p.name: p.read_text() for p in (Path(cfg.run_dir) / "eval").glob("*.json")}
    lines = []
    again = run_study(cfg, ["train", "evaluate"], log=lines.append)
    assert again.summary == {} and again.runs == result.runs
    assert {label: (Path(f) / "done.json").read_text() for label, f in result.runs.items()} == done
    assert {p.name: p.read_text() for p in (Path(cfg.run_dir) / "eval").glob("*.json")} == evals
    assert not any("step" in line for line in lines)  # nothing trained again


def test_a_rerun_of_one_seed_reproduces_its_record(study, tmp_path):
    """The same run in a fresh folder gives the recorded weights and logged steps bit for bit (CPU, one thread
    count); a run with no record, or an unknown one, is refused."""
    from setpo_lab.studies import short_answers

    cfg, _, _ = study
    check = short_answers._rerun_check(cfg, "setpo_s1", tmp_path / "again", log=lambda *_: None)
    assert check == {"label": "setpo_s1", "same_weights": True, "steps_compared": 3, "differing_steps": {}}
    with pytest.raises(ValueError, match="unknown run"):
        short_answers._rerun_check(cfg, "ppo_s9", tmp_path / "x")
    with pytest.raises(ValueError, match="no record"):
        short_answers._rerun_check(replace(cfg, run_dir=str(tmp_path / "empty")), "grpo_s0", tmp_path / "y")


def test_the_folder_is_claimed_for_one_configuration(study):
    cfg, _, _ = study
    with pytest.raises(ValueError, match="lr"):
        run_study(replace(cfg, lr=1e-3), ["report"])


def test_model_metrics_count_pass_at_k_and_distinct_right_answers():
    evaluation = {"task_ids": ["between:23:41", "add_1x1:3:4"],
                  "answers": [[25, 25, 30, 99], [7, None, 8, 7]], "similarity": [0.5, None],
                  "texts": [["Answer: 25", "Answer: 25\nNo, 30.", "Answer: 30\n", "Answer: 99"],
                            ["Answer: 7", "seven\n", "Answer: 8\n\n Question: 2 + 2?", "Answer: 7"]]}
    m = short_answers_results._model_metrics(evaluation)
    assert m["distinct_right"] == 2  # 25 and 30; 99 is out of range
    assert m["pass@1"] == pytest.approx(0.5) and m["pass_at_k"][4] == 1.0
    assert m["reward"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert m["similarity"] == 0.5 and m["answered"] == pytest.approx(7 / 8)
    assert m["after_answer"] == pytest.approx((1 / 4 + 1 / 4) / 2)  # a bare newline is not text after the answer
    assert powers_of_two(64) == [1, 2, 4, 8, 16, 32, 64] and powers_of_two(6) == [1, 2, 4]


def test_results_markdown_names_the_command_and_intervals(study):
    _, result, _ = study
    text = results_markdown(result.summary)
    assert "python -m setpo_lab run short_answers" in text and "SetPO+GRPO − GRPO" in text
    said = reading(result.summary)
    grpo, setpo = list(result.summary["by_method"])
    went = [p for p in result.summary["paired"] if p["a"] == setpo and p["b"] == grpo and p["lo"] is not None
            and ((p["metric"] == "similarity" and p["hi"] < 0) or (p["metric"] == "after_answer" and p["lo"] > 0)
                 or (p["metric"] == "distinct_right" and p["lo"] <= 0))]
    # one bullet for the reward's rise, one per metric compared, and the closing one exactly when its rule holds
    assert "GRPO's training reward" in said and said.count("- **") == 1 + 5 + (len(went) == 3)


def test_reading_says_where_setpo_diversity_went_only_when_the_numbers_say_so(study):
    """The closing bullet is a rule over three paired differences, not prose: lower similarity, more text after
    the answer line, and no detectably higher count of distinct right answers."""
    import copy

    _, result, _ = study
    record = copy.deepcopy(result.summary)
    grpo, setpo = list(record["by_method"])

    def set_interval(metric, lo, hi):
        p = next(p for p in record["paired"] if p["metric"] == metric and p["a"] == setpo and p["b"] == grpo)
        p.update(mean=(lo + hi) / 2, lo=lo, hi=hi)

    set_interval("similarity", -0.5, -0.4)
    set_interval("after_answer", 0.6, 0.9)
    set_interval("distinct_right", -0.5, 1.5)
    record["by_method"][setpo]["after_answer"]["mean"] = 0.95
    record["by_method"][grpo]["after_answer"]["mean"] = 0.01
    said = reading(record)
    assert f"Where {setpo}'s diversity went" in said and "95.0% of its test samples" in said and "(1.0% of" in said
    set_interval("distinct_right", 0.5, 1.5)  # more right answers: the diversity did buy something
    assert "diversity went" not in reading(record)
    set_interval("distinct_right", -0.5, 1.5)
    set_interval("after_answer", -0.1, 0.2)
    assert "diversity went" not in reading(record)


@pytest.mark.parametrize("bad, match", [({"seeds": ()}, "seeds"), ({"seeds": (1, 1)}, "seeds"),
                                        ({"lam": 0.0}, "lam"), ({"group_size": 2}, "group_size"),
                                        ({"steps": 0}, "steps"), ({"kinds": ("primes",)}, "kinds")])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        ShortAnswerStudyConfig(**bad)


def test_presets_and_stages_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="preset"):
        ShortAnswerStudyConfig.preset("huge")
    with pytest.raises(ValueError, match="valid stages"):
        run_study(ShortAnswerStudyConfig(run_dir=str(tmp_path)), ["plot"])
    assert STAGES == ("train", "evaluate", "report")
    # a missing model: one line and exit status 1, before the folder is claimed (was a FileNotFoundError traceback)
    assert run_command(COMMAND, ["--out", str(tmp_path / "x"), "--preset", "smoke",
                                 "--model-path", str(tmp_path / "none")]) == 1
    assert "no model folder" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_run_whose_model_is_gone_is_trained_again_only_when_needed_and_must_match(study, tmp_path):
    """A study folder kept in git holds each run's records, not its model: with its evaluation done nothing is
    retrained; without it the run is trained again and must give the recorded weights."""
    import shutil

    from setpo_lab.studies.short_answers import train_run

    cfg, result, _ = study
    copy = tmp_path / "kept"
    shutil.copytree(cfg.run_dir, copy)
    moved = replace(cfg, run_dir=str(copy))
    final = copy / "train" / "grpo_s1" / "final"
    (final / "model.safetensors").unlink()
    assert not list((copy / "train" / "grpo_s1").glob("checkpoint-*"))  # a finished run keeps none (nor does git)
    recorded = (final / "done.json").read_text()
    logs = (copy / "train" / "grpo_s1" / "log_history.json").read_text()
    train_run(moved, "grpo_s1", need_model=False, log=lambda *_: None)
    assert not (final / "model.safetensors").exists()  # evaluated already: nothing needs the model
    train_run(moved, "grpo_s1", log=lambda *_: None)
    assert (final / "model.safetensors").exists() and (final / "done.json").read_text() == recorded
    assert (copy / "train" / "grpo_s1" / "log_history.json").read_text() == logs


def test_figures_draw_from_the_report(study):
    """The training figure (per method in each of its four panels: each seed and the mean with 2 seeds, the mean and
    its band with more) and the pass@k figure
    (the base model and each method) build from a report, as notebook 04 draws the committed record."""
    from setpo_lab.studies.short_answers_results import pass_at_k_figure, training_figure

    cfg, result, _ = study
    training = training_figure(cfg, result.summary)
    assert len([t for t in training.data if t.showlegend is not False and t.name]) >= 2
    assert len(training.data) == 4 * 2 * 3  # two seeds: four panels × two methods × (each seed, the mean)
    assert "each seed" in training.layout.title.text
    assert all(t.line.dash == "solid" for t in training.data if t.showlegend is not False and t.name)
    three = replace(cfg, seeds=(0, 1, 2))  # with 3 seeds or more: the mean and its 95% band
    record = {**result.summary, "runs": {**result.summary["runs"], "grpo_s2": result.summary["runs"]["grpo_s0"],
                                         "setpo_s2": result.summary["runs"]["setpo_s1"]}}
    banded = training_figure(three, record)
    assert len(banded.data) == 4 * 2 * 2 and "95% band" in banded.layout.title.text
    passk = pass_at_k_figure(cfg, result.summary)
    names = [t.name for t in passk.data if t.name]
    assert names == ["base model", "GRPO", "SetPO+GRPO"]
    assert list(passk.data[0].x) == [1, 2, 4]  # k up to eval_n = 4


def test_bf16_work_is_refused_on_a_cpu_without_bf16_matrix_units(study, tmp_path, monkeypatch):
    """The committed records were made in bf16 on CPUs with bf16 matrix units; elsewhere bf16 runs hundreds of
    times slower and need not round alike: training and evaluating in bf16 are refused there, before anything in
    the run's folder changes, and the same work in float32 goes on."""
    import shutil

    import setpo_lab.repro.arithmetic as arithmetic
    from setpo_lab.studies import short_answers
    from setpo_lab.studies.short_answers import evaluate_answers, train_run

    cfg, _, _ = study
    copy = tmp_path / "kept"
    shutil.copytree(cfg.run_dir, copy)
    final = copy / "train" / "grpo_s1" / "final"
    (final / "model.safetensors").unlink()
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    monkeypatch.setattr(arithmetic, "bf16_matrix_units", lambda: False)
    in_bf16 = replace(cfg, run_dir=str(copy), bf16=True)
    with pytest.raises(ValueError, match="training run grpo_s1 runs in bf16 .* no bf16 matrix units"):
        train_run(in_bf16, "grpo_s1", log=lambda *_: None)
    with pytest.raises(ValueError, match="evaluating extra runs in bf16 .*bf16=False"):
        evaluate_answers(in_bf16, "extra", final.parent.parent / "grpo_s0" / "final", None, folder="eval_extra")
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before  # nothing moved, nothing written
    short_answers._require_bf16_units(replace(in_bf16, bf16=False), "float32 work")  # not refused
    monkeypatch.setattr(arithmetic, "bf16_matrix_units", lambda: True)
    short_answers._require_bf16_units(in_bf16, "bf16 work on a CPU with the units")  # not refused
