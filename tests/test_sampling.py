"""The evaluation sampler's speed-ups give the samples the plain sampler gives, and a long evaluation resumes.

- ``NucleusMask`` keeps exactly the tokens transformers' top-p keeps (its top-k shortcut and its sorted fallback);
- ``share_prompt`` (one forward pass per prompt for its n samples) and ``fast_nucleus`` sample what ``generate``
  samples on its own, with prompts of different lengths in one left-padded batch;
- an evaluation stopped part-way resumes from its kept batches with the same samples, and its time adds up;
- the heartbeat logs while a long call runs and its clock adds up sittings;
- the paired comparison over problems and the reading written from it.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from setpo.studies import math as ml
from setpo.studies import math_results as mr
from setpo.studies.sampling import NucleusMask, sample_completions, stop_token_ids
from setpo.studies.stages import heartbeat, sittings_seconds
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
    whole = ml.evaluate_model(cfg, model_dir, problems, cache=tmp_path / "whole.json")
    # a run that kept only its first batch before it was stopped: the partial file, with a last line cut short
    first_batch = ml.sample_eval_texts(cfg, model_dir, problems[:2], partial=tmp_path / "cut.partial.jsonl")
    assert [texts[:2] for texts in first_batch] == whole["examples"][:2]  # the examples: 2 samples each
    with (tmp_path / "cut.partial.jsonl").open("a") as f:
        f.write('{"first": 2, "texts": [["cut')
    lines = []
    resumed = ml.evaluate_model(cfg, model_dir, problems, cache=tmp_path / "cut.json", log=lines.append)
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


def _evaluation(correct, n):
    return {"k": n, "n_problems": len(correct), "correct": correct,
            "pass_at_k": [0.0] * n, "seconds": 60.0}


def test_paired_differences_over_problems_and_the_reading_written_from_them():
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
    text = mr.reading(cfg, {"base model": {**base, "pass_at_k": [0.1, 0.2, 0.3, 0.5]}, "GRPO": noisy},
                      mr.paired_differences({"base model": base, "GRPO": noisy}, [("GRPO", "base model")]),
                      {"GRPO": {0: 0.9, 6: 0.95}}, {"GRPO": 3.0})
    assert "no detectable change" in text and "2 of 4 problems solved at least once" in text
    assert "0.900 at step 0, 0.950 at step 6 (+0.050)" in text and "GRPO 3 min" in text
