"""The peers of the confirmatory study, each against a reference written here from its paper's formula, in the
core and on TRL and verl: F-GRPO's focal weighting (arXiv 2602.06717) and outcome-based exploration's batch
penalty (arXiv 2509.06941)."""

import copy
import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import completion_texts, score_batch
from omegaconf import OmegaConf
from verl.protocol import DataProto

import setpo.verl as sv
from setpo import group_advantages, setpo_advantages
from setpo.advantages import FOCAL_GAMMA, check_estimator, estimator_group_minimum
from setpo.embed import TextKeyEmbedder
from setpo.trl import SetPOConfig, SetPOTrainer
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer


def grpo_reference(rewards, eps):
    """(r − mean) / (std + eps) with the unbiased std, one group, in Python floats."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [0.0 if std == 0 else (r - mean) / (std + eps) for r in rewards]


def focal_reference(rewards, gamma, eps):
    """F-GRPO, Eqs. 11-13 of arXiv 2602.06717: μ̂_pos = X/N (X correct of N), g = (1 − μ̂_pos)^γ, A^F = g · A^GRPO."""
    mu = sum(r >= 1 for r in rewards) / len(rewards)
    return [(1 - mu) ** gamma * a for a in grpo_reference(rewards, eps)]


def batch_reference(answers):
    """Outcome-based exploration's batch penalty (arXiv 2509.06941): b_i = −(1/n) Σ_{j≠i} 1{a_i = a_j}."""
    n = len(answers)
    return [-sum(a == b for j, b in enumerate(answers) if j != i) / n for i, a in enumerate(answers)]


def _groups(seed=0, sizes=(8, 8, 5, 6, 8)):
    rng = np.random.default_rng(seed)
    return [rng.choice([0.0, 1.0], size=n, p=[0.4, 0.6]).tolist() for n in sizes]


@pytest.mark.parametrize("name,gamma", [("focal:grpo", FOCAL_GAMMA), ("focal@1:grpo", 1.0), ("focal@2.0:grpo", 2.0),
                                        ("focal@0:grpo", 0.0)])
def test_focal_weighting_is_the_papers_formula(name, gamma):
    groups = _groups()
    rewards = [r for g in groups for r in g]
    index = [i for i, g in enumerate(groups) for _ in g]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), index, estimator=name, eps=1e-6)
    want = [a for g in groups for a in focal_reference(g, gamma, 1e-6)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert FOCAL_GAMMA == 0.5  # the paper's runs chose 0.5 most often (Table 7)


def test_focal_composes_with_every_base_and_is_checked_by_name():
    r = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1])
    for base in ("rloo", "dr_grpo", "pass@4"):
        g = (1 - 3 / 8) ** FOCAL_GAMMA
        torch.testing.assert_close(group_advantages(r, estimator=f"focal:{base}"),
                                   g * group_advantages(r, estimator=base))
    assert estimator_group_minimum("focal:pass@4") == 4 and estimator_group_minimum("focal:grpo") == 2
    # ±1 rewards: μ̂ is the share of +1, as the paper's (R̄ − R_w)/(R_c − R_w)
    pm = torch.tensor([1.0, -1, -1, -1])
    torch.testing.assert_close(group_advantages(pm, estimator="focal@1:grpo"),
                               0.75 * group_advantages(pm, estimator="grpo"))
    for bad in ("focal:", "focal:focal:grpo", "focal@x:grpo", "focal@-1:grpo", "focal:nope", "Focal:grpo"):
        with pytest.raises(ValueError, match="unknown estimator"):
            check_estimator(bad)


def test_outcome_batch_penalty_is_the_papers_formula():
    answers = ["4", "4", "7", "4", "9", "7", "1", "4", "x", "x", "y"]
    index = [0] * 8 + [1] * 3
    rewards = torch.tensor([1.0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 1])
    emb = TextKeyEmbedder()(answers)
    adv, b = setpo_advantages(rewards, emb, index, lam=0.2, diversity="outcome_batch", return_marginals=True)
    want = batch_reference(answers[:8]) + batch_reference(answers[8:])
    torch.testing.assert_close(b.double(), torch.tensor(want, dtype=torch.float64))
    torch.testing.assert_close(adv, group_advantages(rewards, index) + 0.2 * b)
    # rows with nothing to read leave the group: n counts the others
    rows = torch.tensor([True] * 7 + [False] + [True] * 3)
    _, b_read = setpo_advantages(rewards, emb, index, lam=0.2, diversity="outcome_batch", term_rows=rows,
                                 return_marginals=True)
    want = batch_reference(answers[:7]) + [0.0] + batch_reference(answers[8:])
    torch.testing.assert_close(b_read.double(), torch.tensor(want, dtype=torch.float64))


# ------------------------------------------------------------------ on TRL and on verl

PROMPTS, G = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"], 6


def first_char(text):
    """The answer reader of these tests: the first non-blank character (None: blank)."""
    text = text.strip()
    return text[:1] or None


def right_if_digit(completions, **_):
    return [1.0 if c.strip()[:1].isdigit() else 0.0 for c in completions]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)


def _trl_batch(tiny, tmp_path, **kw):
    tok, model = tiny
    args = SetPOConfig(output_dir=str(tmp_path), num_generations=G, per_device_train_batch_size=len(PROMPTS) * G,
                       max_completion_length=6, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                       beta=0.0, seed=0, disable_tqdm=True, **kw)
    trainer = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=right_if_digit, args=args, processing_class=tok,
                           train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    out = score_batch(trainer, PROMPTS, G)
    return out, completion_texts(trainer, out)


def _verl(texts, rewards, **setpo):
    uids = np.array([f"p{i // G}" for i in range(len(texts))], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.tensor(rewards)[:, None],
                                        "response_mask": torch.ones(len(texts), 1)},
                               non_tensors={"uid": uids, sv.TEXTS_KEY: np.array(texts, dtype=object)})
    cfg = OmegaConf.create({"adv_estimator": "setpo", "setpo": setpo})
    return sv.compute_advantage(data, config=cfg).batch["advantages"][:, 0]


def test_focal_on_trl_and_verl_matches_the_reference(tiny, tmp_path):
    out, texts = _trl_batch(tiny, tmp_path, setpo_lambda=0.0, setpo_log_diversity=False,
                            setpo_estimator="focal:grpo")
    rewards = right_if_digit(texts)
    groups = [rewards[i:i + G] for i in range(0, len(rewards), G)]
    assert any(0 < sum(g) < G for g in groups)  # some group has a spread, and a focal weight below 1
    want = torch.tensor([a for g in groups for a in focal_reference(g, FOCAL_GAMMA, 1e-4)])  # TRL's ε
    torch.testing.assert_close(out["advantages"], want.float(), rtol=1e-5, atol=1e-6)
    got = _verl(texts, rewards, lam=0.0, estimator="focal:grpo")
    want = torch.tensor([a for g in groups for a in focal_reference(g, FOCAL_GAMMA, 1e-6)])  # verl's ε
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)


def test_outcome_batch_on_trl_and_verl_matches_the_reference(tiny, tmp_path):
    lam = 0.2  # the paper's c
    out, texts = _trl_batch(tiny, tmp_path, setpo_lambda=lam, setpo_diversity="outcome_batch", embedder="key",
                            setpo_kernel_reads="answer", setpo_answer_reader="test_peers:first_char")
    rewards = right_if_digit(texts)
    answers = [first_char(t) for t in texts]
    assert all(a is not None for a in answers)
    bonus = torch.tensor([b for i in range(0, len(texts), G) for b in batch_reference(answers[i:i + G])])
    assert bonus.min() < 0
    grpo = torch.tensor([a for i in range(0, len(texts), G) for a in grpo_reference(rewards[i:i + G], 1e-4)])
    torch.testing.assert_close(out["advantages"], (grpo + lam * bonus).float(), rtol=1e-5, atol=1e-6)
    got = _verl(texts, rewards, lam=lam, diversity="outcome_batch", embedding_model="key", embedding_device="cpu",
                kernel_reads="answer", answer_reader="test_peers:first_char")
    grpo = torch.tensor([a for i in range(0, len(texts), G) for a in grpo_reference(rewards[i:i + G], 1e-6)])
    torch.testing.assert_close(got, (grpo + lam * bonus).float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="algorithm.setpo.diversity must be one of"):
        sv.SetPOVerlSettings(lam=0.1, diversity="batch")


def test_verl_focal_follows_norm_adv_by_std_in_grpo():
    r = torch.tensor([1.0, 0, 0, 1, 1, 0])
    ids = ["a"] * 6
    from setpo.verl.estimator import verl_setpo_advantages

    adv, _, _ = verl_setpo_advantages(r, None, ids, lam=0.0, estimator="focal:grpo", norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, 0.5 ** FOCAL_GAMMA * (r - r.mean()))
