"""The engine's training-stage frame (``engine.train_stage``) and probe sampler (``engine.probe_sampler``), which the
Countdown, math and short-answer studies share: tested here with a stand-in for training, so each rule is seen alone."""

import json

import pytest

from setpo.trl.training import DONE_FILE, WEIGHT_FILES
from setpo_lab.studies import engine, sampling
from setpo_lab.studies.stages import RECORDED_FILE, RestoreMismatch


def fitter(weights: str, calls: list):
    """A stand-in ``fit(final)``: leaves a checkpoint and a finished model whose weights hash is ``weights``."""
    def fit(final):
        calls.append(final)
        (final.parent / "checkpoint-2").mkdir(parents=True, exist_ok=True)
        (final.parent / "log_history.json").write_text("[2]")
        final.mkdir(parents=True, exist_ok=True)
        (final / WEIGHT_FILES[0]).write_bytes(weights.encode())
        (final / DONE_FILE).write_text(json.dumps({"weights_sha256": weights, "seconds": len(calls)}))
    return fit


def test_a_stage_trains_once_and_keeps_no_checkpoint(tmp_path):
    calls, out = [], tmp_path / "run"
    final = engine.train_stage(out, "[run]", "run", fitter("w1", calls), print)
    assert final == out / "final" and calls == [final] and not list(out.glob("checkpoint-*"))
    assert engine.train_stage(out, "[run]", "run", fitter("w1", calls), print) == final and len(calls) == 1


def test_a_recorded_stage_without_its_model_is_trained_again_only_when_needed_and_checked(tmp_path):
    calls, logs, out = [], [], tmp_path / "run"
    final = engine.train_stage(out, "[run]", "run", fitter("w1", calls), print)
    (final / WEIGHT_FILES[0]).unlink()  # git keeps the records, not the model
    (out / "log_history.json").write_text("[1]")  # the first training's records
    assert engine.train_stage(out, "[run]", "run", fitter("w1", calls), logs.append, need_model=False) == final
    assert len(calls) == 1 and (final / DONE_FILE).is_file()  # nothing will load it: not trained, not moved

    def cannot():
        raise ValueError("this machine cannot")
    with pytest.raises(ValueError, match="cannot"):  # refused before anything is set aside
        engine.train_stage(out, "[run]", "run", fitter("w1", calls), logs.append, can_train=cannot)
    assert (final / DONE_FILE).is_file() and not (final / RECORDED_FILE).exists() and len(calls) == 1

    engine.train_stage(out, "[run]", "run", fitter("w1", calls), logs.append)  # the same weights: restored
    assert len(calls) == 2 and "training it again, to the recorded weights" in logs[0]
    assert json.loads((final / DONE_FILE).read_text())["seconds"] == 1  # the recorded record, its times the first's
    assert (out / "log_history.json").read_text() == "[1]" and not (final / RECORDED_FILE).exists()

    (final / WEIGHT_FILES[0]).unlink()
    with pytest.raises(RestoreMismatch, match="other weights"):  # another machine's arithmetic: refused, deleted
        engine.train_stage(out, "[run]", "run", fitter("w2", calls), logs.append)
    assert not (final / WEIGHT_FILES[0]).exists() and (out / "log_history.json").read_text() == "[1]"


def test_the_probe_sampler_records_every_sample_of_every_probe_at_the_steps_seed(monkeypatch):
    seen = {}

    def fake_sample(model, tokenizer, prompts, n, seed, **settings):
        seen.update(prompts=prompts, n=n, seed=seed, **settings)
        return [[f"{p}-{i}" for i in range(n)] for p in prompts]

    monkeypatch.setattr(sampling, "sample_completions", fake_sample)
    sample = engine.probe_sampler("tok", ["a", "b"], ["<a>", "<b>"], 2, lambda j, item, text: (j, item, text),
                                  seed=10, temperature=0.7)
    assert sample("model", 3) == [(0, "a", "<a>-0"), (0, "a", "<a>-1"), (1, "b", "<b>-0"), (1, "b", "<b>-1")]
    assert seen == {"prompts": ["<a>", "<b>"], "n": 2, "seed": 13, "temperature": 0.7}
