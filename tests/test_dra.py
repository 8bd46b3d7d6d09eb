"""DRA-GRPO's reward adjustment (arXiv 2505.09655), held to a direct transcription of its formula."""

import numpy as np
import pytest
import torch

import setpo
from setpo.advantages import dra_advantages
from setpo.diversity import dra_rewards


def transcription(rewards, emb, index):
    """r̃_i = r_i / (1 + Σ_{j≠i, same group} max(0, cos(e_i, e_j))), one response at a time."""
    e = np.asarray(emb, dtype=np.float64)
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    out = []
    for i, gi in enumerate(index):
        rest = sum(max(0.0, float(unit[i] @ unit[j])) for j, gj in enumerate(index) if gj == gi and j != i)
        out.append(rewards[i] / (1.0 + rest))
    return np.array(out)


def test_dra_rewards_match_the_formula_on_shuffled_ragged_groups():
    gen = np.random.default_rng(4)
    emb = gen.normal(size=(9, 5))
    rewards = gen.choice([0.0, 0.1, 1.0], size=9)
    index = ["x", "y", "x", "z", "y", "x", "z", "y", "y"]
    np.testing.assert_allclose(dra_rewards(rewards, emb, index).numpy(), transcription(rewards, emb, index),
                               rtol=1e-12)
    adv = dra_advantages(rewards, emb, index)
    torch.testing.assert_close(adv, setpo.group_advantages(transcription(rewards, emb, index), index))


def test_a_duplicated_response_keeps_less_of_its_reward():
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    r = dra_rewards([1.0, 1.0, 1.0, 1.0], emb)
    assert r[:3].tolist() == [pytest.approx(1 / 3)] * 3 and r[3] == 1.0
    assert dra_advantages([1.0, 1.0, 1.0, 1.0], emb)[3] > 0  # the unique correct answer is pushed up


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="rewards has shape"):
        dra_rewards([1.0, 0.0], torch.randn(3, 2))
    with pytest.raises(ValueError, match="NaN"):
        dra_rewards([1.0, float("nan"), 0.0], torch.randn(3, 2))
    with pytest.raises(ValueError, match="at least 2"):
        dra_rewards([1.0, 0.0, 1.0], torch.randn(3, 2), [0, 0, 1])
    with pytest.raises(ValueError, match="zero-norm"):
        dra_rewards([1.0, 0.0, 1.0], torch.zeros(3, 2))


def test_on_a_0_1_reward_an_all_correct_group_gets_full_size_advantages():
    """Why DRA-GRPO collapsed on Countdown (docs/studies/countdown.md): GRPO gives a group of all-correct answers no
    advantage, but DRA's rescaled rewards differ there by a few hundredths, and the per-group standardisation makes
    those into advantages as large as correctness gets in a mixed group, negative for the common correct answers."""
    from setpo.embed import HashedNgramEmbedder

    texts = ["<answer>14+18+6-14</answer>"] * 4 + ["<answer>18+6</answer>", "<answer>6+18</answer>",
                                                   "<answer>18-14+6+14</answer>"]
    emb = HashedNgramEmbedder()(texts)
    correct = torch.ones(7)
    adjusted = dra_rewards(correct, emb)
    assert float(adjusted.max() - adjusted.min()) < 0.05  # rewards barely apart...
    dra = dra_advantages(correct, emb, group_size=7)
    assert torch.all(setpo.group_advantages(correct, group_size=7) == 0)
    assert float(dra[:4].max()) < -0.5 and float(dra.max()) > 1.0  # ...advantages at full size
    mixed = setpo.group_advantages(torch.tensor([1.0, 1, 1, 0, 0, 0, 0]), group_size=7)
    assert float(dra.abs().max()) > float(mixed.abs().max())
