"""What every study shares (``setpo_lab.studies.stages``): one folder claim that refuses another config naming the
fields, refusals that name the file and what to do, exactly the stages asked for, progress lines while
data is built, and one run_study shape returning one StudyResult."""

import json
from dataclasses import asdict, replace

import pytest

import setpo_lab.studies.countdown as countdown
import setpo_lab.studies.countdown_data as countdown_data
from setpo.presets import PAPER_RUN
from setpo.trl.training import WEIGHT_FILES
from setpo_lab.studies import math as ml
from setpo_lab.studies import stages
from setpo_lab.studies.countdown import CountdownLMConfig, make_data, run_study, sft_examples
from setpo_lab.studies.toy import ToyConfig, train
from setpo_lab.studies.arguments import run_command

SMALL_TOY = dict(steps=3, groups_per_step=4, snapshot_every=6, snapshot_samples=16)


def test_claim_folder_records_then_refuses_another_config_naming_nested_fields(tmp_path):
    folder = tmp_path / "run"
    cfg = {"lr": 0.1, "seed": 0, "out": "a", "model": {"hidden": 8, "layers": 2}}
    stages.claim_folder(folder, cfg, ignore=("out",))
    assert json.loads((folder / "config.json").read_text()) == cfg
    stages.claim_folder(folder, {**cfg, "out": "b"}, ignore=("out",))  # a result-neutral field may differ
    with pytest.raises(ValueError) as err:
        stages.claim_folder(folder, {**cfg, "lr": 0.2, "model": {"hidden": 16, "layers": 2}}, ignore=("out",),
                            remedy="delete it and rerun")
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and "['lr', 'model.hidden']" in msg and "0.1 there, 0.2 now" in msg
    assert msg.endswith(f"{folder / 'config.json'}; delete it and rerun")
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match=r"holds results \(final\) but no config.json"):
        (folder / "final").mkdir()
        stages.claim_folder(folder, cfg, results=("final", "checkpoint-*"))


def test_stage_done_asks_the_trainers_marker(tmp_path):
    assert not stages.stage_done(tmp_path)
    (tmp_path / "done.json").write_text("{}")
    assert stages.stage_done(tmp_path)


@pytest.mark.parametrize("content", [b"", b"\x00\x01random bytes\xff" * 50, b"PK\x03\x04" + b"\x00" * 300])
def test_toy_checkpoint_refusal_leads_with_the_file_and_what_to_do(tmp_path, content):
    """A damaged checkpoint is one line that leads with the file and the remedy, then a short cause in the
    package's words (tests/test_refusals.py checks every loader this way)."""
    (tmp_path / "checkpoint.pt").write_bytes(content)
    with pytest.raises(ValueError) as err:
        train(ToyConfig(checkpoint_dir=str(tmp_path), **SMALL_TOY), progress=False)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1, msg
    assert msg.startswith("checkpoint.pt: cannot be loaded; delete it and rerun to start this run over (cause: "), msg
    assert msg.endswith(f"; at {tmp_path / 'checkpoint.pt'})"), msg


def test_toy_refusal_of_another_config_ends_with_the_file_and_what_to_do(tmp_path):
    cfg = ToyConfig(checkpoint_dir=str(tmp_path), **SMALL_TOY)
    train(cfg, progress=False)
    with pytest.raises(ValueError) as err:
        train(replace(cfg, lr=0.5), progress=False)
    msg = str(err.value)
    assert "different configuration (fields ['lr']" in msg and len(msg.splitlines()) == 1
    assert msg.endswith(f"{tmp_path / 'checkpoint.pt'}; use another checkpoint_dir, or delete it and rerun to "
                        "start over")


def _math_folder(tmp_path, cfg, label="SetPO+GRPO", lam=0.05):
    """A finished math run folder as train_rl leaves it (its run_config.json, final/done.json and weights: one
    recorded as done without its model is trained again, ``engine.train_stage``)."""
    run = tmp_path / "run" / label.replace("+", "_")
    (run / "final").mkdir(parents=True)
    (run / "final" / "done.json").write_text("{}")
    (run / "final" / WEIGHT_FILES[0]).write_bytes(b"")
    (run / "run_config.json").write_text(json.dumps({"label": label, "lambda": lam, "config": asdict(cfg)}))
    return run


def test_math_refuses_a_run_folder_made_with_another_config(tmp_path):
    """The math study compares the run_config.json it wrote, like the other studies."""
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path / "run"))
    run = _math_folder(tmp_path, cfg)
    assert ml._train_rl(cfg, "SetPO+GRPO", 0.05, [], []) == run / "final"  # same config: the finished run
    # evaluation settings and the checkpoint interval change nothing the folder holds
    assert ml._train_rl(replace(cfg, eval_k=7, save_steps=3), "SetPO+GRPO", 0.05, [], []) == run / "final"
    with pytest.raises(ValueError) as err:
        ml._train_rl(replace(cfg, lr=0.5, seed=3), "SetPO+GRPO", 0.05, [], [])
    msg = str(err.value)
    assert "['config.lr', 'config.seed']" in msg and len(msg.splitlines()) == 1
    assert msg.endswith(f"{run / 'run_config.json'}; use another run_dir, or delete that folder and rerun")
    with pytest.raises(ValueError, match=r"\['lambda'\]"):
        ml._train_rl(cfg, "SetPO+GRPO", 0.2, [], [])
    (run / "run_config.json").unlink()
    with pytest.raises(ValueError, match="but no run_config.json"):
        ml._train_rl(cfg, "SetPO+GRPO", 0.05, [], [])


def test_math_defaults_are_the_papers_run_settings():
    cfg = ml.MathRunConfig()
    assert (cfg.num_generations, cfg.temperature, cfg.max_completion_length, cfg.beta, cfg.prompts_per_step,
            cfg.num_train_epochs, cfg.eval_k, cfg.eval_temperature, cfg.eval_top_p) == (
        PAPER_RUN.num_generations, PAPER_RUN.temperature, PAPER_RUN.max_completion_length, PAPER_RUN.beta,
        PAPER_RUN.prompts_per_step, PAPER_RUN.num_train_epochs, PAPER_RUN.eval_k, PAPER_RUN.eval_temperature,
        PAPER_RUN.eval_top_p)
    assert isinstance(cfg.num_train_epochs, float)  # recorded as 2.0, as before


def test_countdown_runs_exactly_the_stages_named(tmp_path):
    """``--stages train`` trains the warm start and the RL runs and evaluates nothing; a stage whose input is
    missing says which stage to run first; a typo names the valid stages."""
    cfg = CountdownLMConfig.smoke(out=str(tmp_path / "study"))
    with pytest.raises(ValueError, match=r"stage 'train' has not finished.*--stages train"):
        run_study(cfg, log=lambda *_: None, stages=["evaluate"])
    assert run_command(countdown.COMMAND, ["--smoke", "--out", cfg.out, "--stages", "train"]) == 0
    made = sorted(p.name for p in (tmp_path / "study").iterdir())
    assert {"sft", "rl", "selection.json"} <= set(made) and not {"eval", "results.json"} & set(made)
    assert stages.stage_done(tmp_path / "study" / "sft" / "final")
    assert all(stages.stage_done(run / "final") for run in (tmp_path / "study" / "rl").iterdir())


def test_countdown_stage_typo_names_the_valid_stages(capsys):
    with pytest.raises(SystemExit) as e:
        run_command(countdown.COMMAND, ["--smoke", "--stages", "train,evaluat"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown stage(s) ['evaluat']" in err and "valid stages: train, evaluate, judge" in err
    with pytest.raises(ValueError, match="valid stages: train, evaluate, judge"):
        run_study(CountdownLMConfig.smoke(), stages=["sft", "evaluate"])  # the stage names before they were shared
    assert stages.chosen_stages("judge,train", countdown.STAGES) == ["train", "judge"]


def test_countdown_data_building_prints_progress_at_least_every_10_s(tmp_path, monkeypatch):
    """A line within the first seconds, then at least every 10 s while the problems are
    solved (a fake clock: each solve takes 1.5 s)."""
    now = [0.0]
    monkeypatch.setattr(stages.time, "monotonic", lambda: now[0])
    real_solve = countdown_data.solve

    def slow_solve(*a):
        now[0] += 1.5
        return real_solve(*a)

    monkeypatch.setattr(countdown_data, "solve", slow_solve)
    lines = []
    cfg = CountdownLMConfig.smoke(out=str(tmp_path / "study"))
    examples = sft_examples(make_data(cfg).train, 2, 0, log=lambda msg: lines.append((now[0], msg)))
    assert examples and lines[0][0] == 0.0 and lines[-1] == (now[0], f"[data] solved {cfg.n_train}/{cfg.n_train}")
    times = [0.0] + [t for t, _ in lines] + [now[0]]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 10.0 + 1.5
    # and the study says what it is doing before it builds any data
    seen = []
    monkeypatch.setattr(countdown, "make_data", lambda cfg: (_ for _ in ()).throw(RuntimeError(len(seen))))
    with pytest.raises(RuntimeError, match="1"):
        run_study(cfg, log=seen.append)
    assert seen[0].startswith("[data] 48 training")


def test_math_run_study_runs_the_stages_named(tmp_path, monkeypatch):
    """run_study's stages: "train" trains every run, "evaluate" samples the base model's pass@k first (before any
    training) and evaluates what the run folders hold (their pass@k, then avg@k), each cached beside the runs."""
    calls = []
    monkeypatch.setattr(ml, "train_runs", lambda cfg, train, probes, log=print:
                        calls.append(("train", len(probes))) or {"GRPO": "g", "SetPO+GRPO": "s"})
    monkeypatch.setattr(ml, "evaluate_avg_at_k", lambda cfg, d, problems, cache=None, texts_file=None, log=None,
                        label="": calls.append(("eval", d, cache.name, texts_file)))
    monkeypatch.setattr(ml, "evaluate_pass_at_k", lambda cfg, models, problems, cache_dir=None, log=print:
                        calls.append(("passk", list(models))) or {})
    monkeypatch.setattr(ml, "resolve_model_path", lambda cfg: "base")
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path))
    out = ml.run_study(cfg, log=lambda *_: None, stages=["train"])
    assert calls == [("train", cfg.n_probe)] and out.runs == {"GRPO": "g", "SetPO+GRPO": "s"} and out.summary == {}
    assert out.study == "math" and out.out == tmp_path
    calls.clear()
    out = ml.run_study(cfg, log=lambda *_: None, stages=["evaluate"])
    assert set(out.runs) == {"GRPO", "SetPO+GRPO"}  # their final folders
    assert calls == [("passk", ["base model"]), ("passk", ["GRPO", "SetPO+GRPO"]),
                     ("eval", tmp_path / "GRPO" / "final", "eval_GRPO.json", None),  # no judge: no texts kept
                     ("eval", tmp_path / "SetPO_GRPO" / "final", "eval_SetPO_GRPO.json", None)]
    with pytest.raises(ValueError, match="valid stages: train, evaluate, judge"):
        ml.run_study(cfg, stages=["eval"])
    with pytest.raises(ValueError, match="stage 'judge' needs a judge"):
        ml.run_study(cfg, stages=["judge"])
    calls.clear()
    out = ml.run_study(cfg, log=lambda *_: None)  # every stage; without a judge, "judge" does nothing
    assert [c[0] for c in calls] == ["passk", "train", "passk", "eval", "eval"]
    assert set(out.summary) == {"pass_at_k", "results"}  # without a judge, nothing judged


def test_every_study_has_one_run_study_shape():
    """``run_study(cfg, stages=None, *, log=print_flushed) -> StudyResult`` in every study (Countdown's also takes
    ``redo``); None runs every one of the study's ``STAGES``, a wrong name is refused naming them."""
    import inspect

    from setpo_lab.studies import rubric, short_answers, toy

    for study in (toy, countdown, ml, rubric, short_answers):
        params = list(inspect.signature(study.run_study).parameters.values())
        assert [p.name for p in params[:2]] == ["cfg", "stages"] and params[1].default is None, study.__name__
        assert params[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:]), study.__name__
        assert params[2].name == "log" and params[2].default is stages.print_flushed, study.__name__
        assert {p.name for p in params[3:]} <= {"redo"}, study.__name__
        assert stages.chosen_stages(None, study.STAGES) == list(study.STAGES)
        assert inspect.signature(study.run_study).return_annotation == "StudyResult", study.__name__
        with pytest.raises(ValueError, match="valid stages: " + ", ".join(study.STAGES)):
            study.run_study(None, stages=["nonsense"])


def test_toy_study_stages(tmp_path):
    """The toy keeps its runs in memory: "train" alone trains and writes nothing; "report" alone is refused."""
    from setpo_lab.studies.toy import run_study
    from setpo_lab.studies.toy_config import ToyStudyConfig

    cfg = ToyStudyConfig(out=str(tmp_path / "demo"), seeds=1, smoke=True)
    with pytest.raises(ValueError, match="'report' needs stage 'train'"):
        run_study(cfg, stages=["report"])
    lines = []
    result = run_study(cfg, stages=["train"], log=lines.append)
    assert set(result.runs) == {"GRPO", "SetPO+GRPO"} and not lines and not (tmp_path / "demo").exists()
    assert result.summary == {} and result.study == "toy" and [len(r) for r in result.runs.values()] == [1, 1]


def test_rubric_study_returns_each_seeds_row_and_the_table():
    """The rubric study keeps nothing on disk: its StudyResult holds each seed's row by seed and the table logged."""
    from setpo_lab.studies.rubric import run_study
    from setpo_lab.studies.rubric_config import RubricStudyConfig, TrainConfig

    lines = []
    result = run_study(RubricStudyConfig(seeds=2, train=TrainConfig(steps=2, n_cal_groups=48)), log=lines.append)
    assert result.study == "rubric" and result.out is None and list(result.runs) == ["seed 0", "seed 1"]
    assert [row["seed"] for row in result.runs.values()] == [0, 1] and result.summary["table"] in lines
    assert result.seconds > 0


def test_a_countdown_run_reaches_the_trainer_with_every_setting(tmp_path):
    """RLRun.trainer_settings is the one place the study's names become the TRL plug-in's (lam -> setpo_lambda,
    term -> setpo_diversity, ...): every field but the preset (config_for's first argument) and the seed (TRL's,
    with the study's common arguments) reaches SetPOConfig with its value, and each changes what it sends."""
    from dataclasses import fields

    from setpo_lab.studies.countdown_config import RLRun
    from setpo.trl import config_for

    run = RLRun(preset="grpo", group_size=3, beta=0.005, lam=0.5, seed=4, embedder="hash", term="pairwise",
                units="term_std")
    settings = run.trainer_settings()
    args = config_for(run.preset, **settings, output_dir=str(tmp_path), use_cpu=True, bf16=False,
                      per_device_train_batch_size=6)
    assert {k: getattr(args, k) for k in settings} == settings
    others = {"group_size": 7, "beta": 0.001, "lam": 0.0, "embedder": "default", "term": "setpo",
              "units": "absolute", "adjust": "dra", "estimator": "pass@2"}
    assert set(others) == {f.name for f in fields(RLRun)} - {"preset", "seed"}  # a new field is added here too
    for name, value in others.items():
        assert replace(run, **{name: value}).trainer_settings() != settings, name


def test_sampling_reports_progress_per_batch_and_samples_the_same():
    """The evaluation's progress lines come from a callback per batch, which leaves the samples as they were."""
    from setpo_lab.studies.sampling import sample_completions
    from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48))
    prompts = ["1 2 = 3\n", "2 3 = 6\n", "4 4 = 8\n", "5 1 = 4\n", "7 2 = 9\n"]
    seen = []
    out = sample_completions(model, tok, prompts, 2, 1.0, batch_sequences=4, seed=3, progress=seen.append)
    assert seen == [2, 2, 1]
    assert out == sample_completions(model, tok, prompts, 2, 1.0, batch_sequences=4, seed=3)
