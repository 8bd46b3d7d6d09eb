"""The confirmatory short-answer study end to end on a tiny model (its smoke preset): the plan pinned and a changed
plan refused, the held-out kinds chosen on the base model's train split before any training, the peers only on their
seeds, every model on the held-out prompts, and the reading by the plan's fixed sequence and Holm."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from setpo.trl.training import weights_sha256
from setpo_lab.studies.intervals import holm, paired_t_test, sign_flip_p, t_interval
from setpo_lab.studies.short_answers import run_study
from setpo_lab.studies.short_answers_config import ConfirmStudyConfig, CureStudyConfig
from setpo_lab.studies import short_answers_confirm
from setpo_lab.studies.short_answers_confirm import (
    SEQUENCE,
    confirm_reading,
    results_markdown,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from setpo.trl.tiny_models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def confirm(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("confirm")
    plan = root / "PLAN.md"
    plan.write_text("# a plan\n")
    cfg = ConfirmStudyConfig.preset("smoke", run_dir=str(root / "c"), model_path=tiny_model, plan=str(plan))
    # an exploratory record as git keeps it: its records, one model's weights not here (trained again to them)
    cure = CureStudyConfig.preset("smoke", run_dir=str(root / "cure"), model_path=tiny_model)
    run_study(cure, ["train"], log=lambda *_: None)
    (root / "cure" / "train" / "key_gated_s0" / "final" / "model.safetensors").unlink()
    lines = []
    return cfg, short_answers_confirm._run_confirm(cfg, log=lines.append, exploratory=root / "cure"), lines


def test_the_confirmatory_preset_is_the_plans():
    cfg = ConfirmStudyConfig.preset("confirm", run_dir="x")
    plan = Path(cfg.plan).read_text()
    assert cfg.seeds == tuple(range(100, 112)) and not set(cfg.seeds) & {0, 1, 2, 3, 4} and "100–111" in plan
    assert cfg.peer_seeds == (100, 101, 102, 103, 104) and "100–104" in plan
    assert cfg.lam_key_gated == 0.5 and cfg.lam_obe == 0.2 and cfg.lam_units == "term_std"
    assert cfg.heldout_candidates == ("odd", "ends_in", "above") and cfg.reuse_from is None
    labels = cfg.run_labels()
    assert len(labels) == 12 * 2 + 5 * 2
    assert cfg.trainer_settings(labels["fgrpo_s100"][0]) == {"setpo_lambda": 0.0, "setpo_estimator": "focal:grpo"}
    obe = cfg.trainer_settings(labels["obe_batch_s100"][0])
    assert obe["setpo_lambda"] == 0.2 and obe["setpo_diversity"] == "outcome_batch"
    assert obe["setpo_lambda_units"] == "absolute" and obe["embedder"] == "key"
    assert list(SEQUENCE) == ["H1", "H2", "H4", "H3"] and "H1 → H2 → H4 → H3" in plan
    with pytest.raises(ValueError, match="peer_seeds must be some of seeds"):
        replace(cfg, peer_seeds=(7,))
    with pytest.raises(ValueError, match="no training pool holds"):
        replace(cfg, heldout_candidates=("between",))


def test_smoke_confirm_pins_the_plan_chooses_held_out_kinds_and_evaluates_every_model(confirm):
    cfg, record, lines = confirm
    root = Path(cfg.run_dir)
    assert json.loads((root / "plan.json").read_text())["sha256"] == record["plan"]["sha256"]
    chosen = json.loads((root / "heldout_kinds.json").read_text())
    assert chosen["kept"] == ["odd", "above"] and chosen["rule"]["split"] == "train"
    trained = {p.name for p in (root / "train").iterdir()}
    assert trained == {"grpo_s100", "key_gated_s100", "fgrpo_s100", "obe_batch_s100", "grpo_s101", "key_gated_s101"}
    # held-out made before any training: its selection evaluations are older than every run
    first_run = min((root / "train" / t / "final" / "done.json").stat().st_mtime for t in trained)
    assert max(p.stat().st_mtime for p in (root / "heldout_selection").glob("*.json")) <= first_run
    heldout = {p.stem for p in (root / "eval_heldout").glob("*.json") if not p.stem.startswith("exploratory_")}
    assert heldout == trained | {"base"}
    assert json.loads((root / "eval_heldout" / "base.json").read_text())["task_ids"] == [
        t.task_id for t in cfg.heldout_tasks()]
    # the peers' trainers got their settings
    history = json.loads((root / "train" / "obe_batch_s100" / "log_history.json").read_text())
    assert any("setpo/s_mean" in h for h in history)


def test_the_reading_follows_the_plans_sequence_and_holm(confirm):
    cfg, record, _ = confirm
    primary = record["primary"]
    assert list(primary) == ["H1", "H2", "H4", "H3"]
    for name, h in primary.items():
        metric, margin = SEQUENCE[name]
        d = [record["per_seed"][f"key_gated_s{s}"][metric] - record["per_seed"][f"grpo_s{s}"][metric]
             for s in cfg.seeds]
        assert h["differences"] == pytest.approx(d)
        want = paired_t_test(d, margin=margin)
        assert h["p"] == want["p"] or (h["p"] != h["p"] and want["p"] != want["p"])  # NaN with no spread
    # the sequence: once a hypothesis is not rejected, the rest are "not tested"
    stopped = False
    for h in primary.values():
        if stopped:
            assert h["verdict"].startswith("not tested")
        stopped = stopped or not h["p"] < 0.05
    secondary = record["secondary"]
    assert set(secondary) == {"S1", "S2", "S3", "S4"}
    ps = {k: v["p"] for k, v in secondary.items()}
    for name, h in holm(ps).items():
        assert secondary[name]["verdict"] == ("confirmed" if h["reject"] else "not confirmed")
    assert (Path(cfg.run_dir) / "results.md").read_text().startswith("# The confirmatory test")
    # the description: each arm's mean over its seeds, the base model as an arm of one
    means = short_answers_confirm._arm_means(record["per_seed"])
    assert means["base"]["seeds"] == 1 and means["key_gated"]["seeds"] == len(cfg.seeds)
    assert means["key_gated"]["distinct_right"] == pytest.approx(
        sum(record["per_seed"][f"key_gated_s{s}"]["distinct_right"] for s in cfg.seeds) / len(cfg.seeds))
    assert all("prompts_under_8_right" in record["per_seed"][label] for label in cfg.run_labels())
    assert "| key_gated | " in (Path(cfg.run_dir) / "results.md").read_text()
    assert "| arm | seeds | distinct_right |" in (Path(cfg.run_dir) / "results.md").read_text()  # seeds once
    assert confirm_reading(cfg)["primary"]["H1"]["differences"] == primary["H1"]["differences"]
    # beside each test: its 90% interval, the sign-flip p and whether it agrees, the bootstrap over seeds x prompts
    for h in [*primary.values(), *secondary.values()]:
        assert h["ci90"] == pytest.approx(t_interval(h["differences"], 0.90))
        assert h["sign_flip_p"] == sign_flip_p(h["differences"], margin=h["margin"])
        if h["p"] == h["p"]:
            assert h["sign_flip_agrees"] == ((h["sign_flip_p"] < 0.05) == (h["p"] < 0.05))
        boot = h["bootstrap"]
        assert boot["lo"] <= boot["mean"] <= boot["hi"] and boot["mean"] == pytest.approx(h["mean"])
    text = (Path(cfg.run_dir) / "results.md").read_text()
    assert "mean d [90% t-interval]" in text and "fixed sequence H1 → H2 → H4 → H3 at α = 0.05" in text
    assert "The exact sign-flip test" in text
    # a p below 0.0001 is printed as such, never as 0.0000 (which reads as p = 0)
    tiny = {**record, "primary": {**primary, "H1": {**primary["H1"], "p": 8.2e-7}}}
    h1_row = next(line for line in results_markdown(tiny).splitlines() if line.startswith("| H1 |"))
    assert "| < 0.0001 |" in h1_row and "0.0000" not in h1_row
    # where the time went: each piece's recorded seconds, in hours, against the plan's budget
    cost = record["cost"]
    trained = sorted((Path(cfg.run_dir) / "train").glob("*/final/done.json"))
    assert cost["runs"] == len(trained) == len(cfg.run_labels())
    assert cost["hours"]["training"] == pytest.approx(sum(json.loads(p.read_text())["seconds"] for p in trained) / 3600)
    assert cost["new_runs_hours"] == pytest.approx(sum(h for k, h in cost["hours"].items() if "exploratory" not in k))
    assert "Cost, wall clock on 2 cores" in text and f"against the plan's {cost['budget_hours']:g} h budget" in text


def test_the_exploratory_records_models_are_evaluated_on_the_held_out_kinds(confirm):
    cfg, record, lines = confirm
    root = Path(cfg.run_dir)
    labels = set(CureStudyConfig.preset("smoke", run_dir="x").run_labels())
    assert {p.stem for p in (root / "eval_heldout").glob("exploratory_*.json")} == {f"exploratory_{x}" for x in labels}
    assert set(record["exploratory_heldout_distinct_right"]) == labels
    kept = json.loads((root / "heldout_kinds.json").read_text())["kept"]
    evaluation = json.loads((root / "eval_heldout" / "exploratory_key_gated_s0.json").read_text())
    assert {t.split(":")[0] for t in evaluation["task_ids"]} <= set(kept) and len(evaluation["answers"][0]) == cfg.eval_n
    # the model that was not here was trained again to its recorded weights (its done.json back as recorded)
    final = root.parent / "cure" / "train" / "key_gated_s0" / "final"
    assert (final / "model.safetensors").exists() and not (final / "done.recorded.json").exists()
    assert json.loads((final / "done.json").read_text())["weights_sha256"] == weights_sha256(final)
    assert "The exploratory record's models on the held-out kinds" in (root / "results.md").read_text()
    assert record["exploratory_not_evaluated"] == [] and "Not evaluated yet" not in (root / "results.md").read_text()
    # a model of the exploratory record not evaluated yet is named, with how to resume
    (root / "eval_heldout" / "exploratory_grpo_s0.json").rename(root / "set_aside.json")
    try:
        partial = confirm_reading(cfg, root.parent / "cure")
        assert partial["exploratory_not_evaluated"] == ["grpo_s0"]
        text = results_markdown({**record, **partial})
        assert f"Not evaluated yet: 1 of the exploratory record's {len(labels)} models (grpo_s0)" in text
    finally:
        (root / "set_aside.json").rename(root / "eval_heldout" / "exploratory_grpo_s0.json")


def test_a_changed_plan_is_refused_after_the_first_run(confirm):
    cfg, _, _ = confirm
    plan = Path(cfg.plan)
    original = plan.read_text()
    try:
        plan.write_text(original + "a change after the first run\n")
        with pytest.raises(ValueError, match="a plan changed after the first run is a deviation"):
            short_answers_confirm._check_plan(cfg)
        with pytest.raises(ValueError, match="deviation"):
            short_answers_confirm._run_confirm(cfg, ["report"])
    finally:
        plan.write_text(original)
    assert short_answers_confirm._check_plan(cfg)["sha256"]
