"""The evaluation sampler's speed-ups give the samples the plain sampler gives, and a long evaluation resumes.

- ``NucleusMask`` keeps exactly the tokens transformers' top-p keeps (its top-k shortcut and its sorted fallback);
- ``share_prompt`` (one forward pass per prompt for its n samples) and ``fast_nucleus`` sample what ``generate``
  samples on its own, with prompts of different lengths in one left-padded batch;
- an evaluation stopped part-way resumes from its kept batches with the same samples, and its time adds up;
- the heartbeat logs while a long call runs and its clock adds up sittings;
- a model folder's identity ignores what a trainer rewrites without changing the model, and a model an
  evaluation already sampled alike (a run whose training never moved it) is not sampled again;
- the paired comparison over problems and the reading written from it.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, TemperatureLogitsWarper, TopPLogitsWarper

from setpo_lab.studies import math as ml
from setpo_lab.studies import math_results as mr
from setpo_lab.studies.sampling import NucleusMask, model_identity, sample_completions, stop_token_ids
from setpo_lab.studies.stages import heartbeat, sittings_seconds
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer


def _removed(scores):
    return scores == float("-inf")


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("candidates", [3, 256])  # 3: most rows need the sorted fallback
def test_nucleus_mask_keeps_what_transformers_top_p_keeps(temperature, candidates):
    torch.manual_seed(0)
    for scale in (0.3, 1.0, 8.0):  # flat to peaked distributions
        scores = torch.randn(32, 700) * scale
        theirs = TopPLogitsWarper(0.9)(None, TemperatureLogitsWarper(temperature)(None, scores.clone()))
        ours = TemperatureLogitsWarper(temperature)(None, NucleusMask(0.9, temperature, candidates)(None, scores))
        assert torch.equal(_removed(theirs), _removed(ours))
        assert not _removed(ours).all(dim=-1).any()  # the most likely token always stays
    with pytest.raises(ValueError, match="top_p"):
        NucleusMask(0.0, 1.0)


def _tiny():
    tok = build_tokenizer()
    return tok, build_model(tok, ModelSize(32, 1, 2, 1, 64, 48))


def test_shared_prompt_passes_and_fast_nucleus_sample_what_generate_samples():
    tok, model = _tiny()
    prompts = ["1 2 = 3\n", "12 31 98 = 7\n", "4 = 4\n"]  # different lengths: left padding inside one batch
    plain = sample_completions(model, tok, prompts, 4, 0.8, top_p=0.9, max_new_tokens=12, seed=5, batch_sequences=8)
    for share, fast in ((True, False), (False, True), (True, True)):
        assert sample_completions(model, tok, prompts, 4, 0.8, top_p=0.9, max_new_tokens=12, seed=5,
                                  batch_sequences=8, share_prompt=share, fast_nucleus=fast) == plain, (share, fast)
    # in pieces of whole batches, with first_index, the samples are those of one call
    step = 2  # batch_sequences 8 // n 4
    pieces = [t for first in range(0, 3, step) for t in sample_completions(
        model, tok, prompts[first:first + step], 4, 0.8, top_p=0.9, max_new_tokens=12, seed=5, batch_sequences=8,
        first_index=first)]
    assert pieces == plain


def test_generation_stops_at_every_eos_of_the_generation_config():
    tok, model = _tiny()
    model.generation_config.eos_token_id = [tok.eos_token_id, 7, 7]
    assert stop_token_ids(model, tok) == [tok.eos_token_id, 7]
    model.generation_config.eos_token_id = None
    assert stop_token_ids(model, tok) == [tok.eos_token_id]


def test_an_evaluation_stopped_part_way_resumes_with_the_same_samples(tmp_path):
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path / "run"), eval_k=32)
    _, val = ml.load_study_problems(cfg)
    problems = val[:5]
    model_dir = ml.resolve_model_path(cfg)
    # in its own folder: an evaluation kept beside another of the same model would be reused, not resumed
    whole = ml.evaluate_avg_at_k(cfg, model_dir, problems, cache=tmp_path / "whole" / "passk.json")
    # a run that kept only its first batch before it was stopped: the partial file, with a last line cut short
    first_batch = ml._sample_eval_texts(cfg, model_dir, problems[:2], partial=tmp_path / "cut.partial.jsonl")
    assert [texts[:2] for texts in first_batch] == whole["examples"][:2]  # the examples: 2 samples each
    with (tmp_path / "cut.partial.jsonl").open("a") as f:
        f.write('{"first": 2, "texts": [["cut')
    lines = []
    resumed = ml.evaluate_avg_at_k(cfg, model_dir, problems, cache=tmp_path / "cut.json", log=lines.append)
    assert resumed["correct"] == whole["correct"] and resumed["examples"] == whole["examples"]
    assert any("resuming: 1 batch(es) already sampled" in line for line in lines)
    assert not (tmp_path / "cut.partial.jsonl").exists()  # the finished evaluation is the cache alone


def test_heartbeat_logs_while_a_call_runs_and_its_clock_adds_up_sittings(tmp_path):
    clock, lines = tmp_path / "clock.json", []
    with heartbeat(lines.append, "[run]", lambda: "step 3", every_s=0.05, clock=clock):
        time.sleep(0.3)
    assert lines and all(line.startswith("[run]: ") and line.endswith(", step 3") for line in lines)
    first = sittings_seconds(clock)
    assert 0.25 < first < 5
    time.sleep(1.1)  # a second sitting (sittings are keyed by their start, to the second)
    with heartbeat(None, "[run]", every_s=0.05, clock=clock):
        time.sleep(0.2)
    assert len(json.loads(clock.read_text())) == 2 and sittings_seconds(clock) > first + 0.15
    assert sittings_seconds(tmp_path / "absent.json") == 0.0


def _trainer_copy(model_dir, to):
    """``model_dir`` as a trainer saves a model it never changed: the same weight bytes, rewritten configs."""
    shutil.copytree(model_dir, to)
    left = {"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0,
            "pad_type_id": 0, "pad_token": "<|endoftext|>"}  # what a fast tokenizer keeps of its last padded call
    for name, edit in (("config.json", {"use_cache": False}), ("tokenizer_config.json", {"local_files_only": True}),
                       ("tokenizer.json", {"padding": left})):
        path = to / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    generation = to / "generation_config.json"
    if generation.is_file():
        config = json.loads(generation.read_text())
        if isinstance(config.get("eos_token_id"), int):
            config["eos_token_id"] = [config["eos_token_id"]]
        generation.write_text(json.dumps(config))
    return to


def test_a_model_folder_s_identity_is_its_weights_tokenizer_and_stop_ids(tmp_path):
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path / "run"))
    model_dir = ml.resolve_model_path(cfg)
    same = _trainer_copy(model_dir, tmp_path / "copy")
    assert model_identity(same) == model_identity(model_dir) is not None
    moved = _trainer_copy(model_dir, tmp_path / "moved")
    model = AutoModelForCausalLM.from_pretrained(moved)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    model.save_pretrained(moved)
    assert model_identity(moved) != model_identity(model_dir)
    stops = _trainer_copy(model_dir, tmp_path / "stops")
    (stops / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5], "pad_token_id": 0}))
    assert model_identity(stops) != model_identity(model_dir)
    (tmp_path / "empty").mkdir()
    assert model_identity(tmp_path / "empty") is None


def test_a_model_already_evaluated_alike_is_not_sampled_again(tmp_path, monkeypatch):
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(tmp_path / "run"), eval_k=8)
    _, val = ml.load_study_problems(cfg)
    problems, model_dir = val[:3], ml.resolve_model_path(cfg)
    base = ml.evaluate_avg_at_k(cfg, model_dir, problems, cache=tmp_path / "run" / "passk_base.json", label="base model")
    untrained = _trainer_copy(model_dir, tmp_path / "GRPO_final")
    # sampled from scratch, the copy gives the base model's samples: what reusing them claims
    fresh = ml.evaluate_avg_at_k(cfg, untrained, problems, cache=tmp_path / "elsewhere" / "passk_grpo.json")
    assert fresh["correct"] == base["correct"] and fresh["examples"] == base["examples"]
    (tmp_path / "run" / "passk_grpo.partial.jsonl").write_text("")  # a stopped try's leftovers go too

    def no_sampling(*args, **kwargs):
        raise AssertionError("sampled a model that was already evaluated")

    monkeypatch.setattr(ml, "_sample_eval_texts", no_sampling)
    lines = []
    grpo = ml.evaluate_avg_at_k(cfg, untrained, problems, cache=tmp_path / "run" / "passk_grpo.json", label="GRPO",
                                log=lines.append)
    assert grpo["same_model_as"] == "base model" and grpo["seconds"] == 0.0 and grpo["label"] == "GRPO"
    assert grpo["correct"] == base["correct"] and grpo["sampled"] == base["sampled"]
    assert any("the same model as 'base model'" in line for line in lines)
    assert not (tmp_path / "run" / "passk_grpo.partial.jsonl").exists()
    with pytest.raises(AssertionError, match="already evaluated"):  # other settings: sampled again
        ml.evaluate_avg_at_k(replace(cfg, eval_temperature=0.7), untrained, problems,
                             cache=tmp_path / "run" / "passk_hot.json")
    # an evaluation kept before evaluations recorded what they sampled is read as it is, never sampled again
    old = tmp_path / "run" / "passk_old.json"
    old.write_text(json.dumps({k: v for k, v in base.items() if k not in ("sampled", "label")}))
    before = old.read_text()
    assert ml.evaluate_avg_at_k(cfg, model_dir, problems, cache=old, label="old") == json.loads(before)
    assert old.read_text() == before


def _evaluation(correct, n):
    return {"k": n, "n_problems": len(correct), "correct": correct,
            "pass_at_k": [0.0] * n, "seconds": 60.0}


def test_paired_differences_over_problems_and_the_reading_written_from_them(tmp_path):
    n = 4
    base = _evaluation([0, 1, 2, 0], n)
    run = _evaluation([1, 2, 3, 1], n)  # one more right sample on every problem: +25 points of pass@1 each
    diffs = mr.paired_differences({"base model": base, "GRPO": run}, [("GRPO", "base model")], ks=(1, 4, 64))
    assert [d["k"] for d in diffs] == [1, 4]  # k beyond n is left out
    assert diffs[0]["mean"] == pytest.approx(0.25) and diffs[0]["lo"] == pytest.approx(0.25)
    assert diffs[1]["mean"] == pytest.approx(0.5)  # pass@4 of 4 samples: solved or not; two problems newly solved
    table = mr.paired_table(diffs)
    assert "GRPO − base model" in table and "+25.0 [+25.0, +25.0]" in table
    with pytest.raises(ValueError, match="not evaluated alike"):
        mr.paired_differences({"a": base, "b": _evaluation([0, 1], n)}, [("a", "b")])
    cfg = ml.MathRunConfig.cpu_demo(smoke=True)
    noisy = _evaluation([0, 3, 0, 1], n)

    def run_dir(label: str, history: list[dict], seconds: float):  # what a finished run leaves
        (tmp_path / label / "final").mkdir(parents=True)
        (tmp_path / label / "log_history.json").write_text(json.dumps([*history, {"train_runtime": seconds}]))
        (tmp_path / label / "final" / "done.json").write_text(json.dumps({"seconds": seconds}))
        return tmp_path / label
    grpo = run_dir("GRPO", [{"step": s, "reward": 0.0, "completions/clipped_ratio": c}
                            for s, c in enumerate([0.5, 1.0, 0.75])], 180.0)
    setpo = run_dir("SetPO+GRPO", [{"step": 1, "reward": 0.0}, {"step": 2, "reward": 0.125}], 240.0)
    text = mr.math_reading(cfg, {"base model": {**base, "pass_at_k": [0.1, 0.2, 0.3, 0.5]}, "GRPO": noisy},
                           mr.paired_differences({"base model": base, "GRPO": noisy}, [("GRPO", "base model")]),
                           {"GRPO": {0: 0.9, 6: 0.95}}, {"GRPO": grpo})
    assert "no detectable change" in text and "2 of 4 problems solved at least once" in text
    assert "0.900 at step 0, 0.950 at step 6 (+0.050)" in text and "training GRPO 3 min;" in text
    same = mr.math_reading(cfg, {"base model": {**base, "pass_at_k": [0.1, 0.2, 0.3, 0.5]},
                                 "GRPO": {**base, "same_model_as": "base model"}}, [], {},
                           {"GRPO": grpo, "SetPO+GRPO": setpo})
    assert "**GRPO** in training: mean reward 0.000; 0 of 3 steps had a right rollout (with every reward 0" in same
    assert f"; 75% of rollouts were cut at {cfg.max_completion_length} tokens." in same
    assert "**SetPO+GRPO** in training: mean reward 0.062; 1 of 2 steps had a right rollout." in same
    assert "**GRPO** after training is the base model, bit for bit" in same
    assert "training GRPO 3 min, SetPO+GRPO 4 min;" in same
