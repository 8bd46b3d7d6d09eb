"""The toy trainer: it learns, it resumes to the same result, and its pieces come from the library."""

import torch

from setpo.envs.bandit import BanditConfig, MultiModalBandit
from setpo_lab.studies import toy, toy_results
from setpo_lab.studies.toy import ToyConfig, train

SMALL = dict(steps=12, groups_per_step=4, snapshot_every=6, snapshot_samples=16)


def test_policy_log_probs_are_a_distribution():
    torch.manual_seed(0)
    pol = toy._TrajectoryPolicy(num_prompts=2, vocab_size=3, traj_len=3)
    for p in range(2):
        assert abs(float(pol.sequence_probs(p).sum()) - 1.0) < 1e-5
    masses = toy._mode_mass(pol, MultiModalBandit(BanditConfig(vocab_size=3, num_prompts=2)))
    torch.testing.assert_close(masses.sum(1), torch.ones(2))


def test_training_raises_reward():
    run = train(ToyConfig(steps=40, groups_per_step=8, seed=1), progress=False)
    assert run.history[-1]["correct_mass"] > run.history[0]["correct_mass"] + 0.3


def test_resume_reproduces_uninterrupted_run(tmp_path):
    straight = train(ToyConfig(setpo=True, **SMALL), progress=False)
    half = ToyConfig(setpo=True, checkpoint_dir=str(tmp_path), checkpoint_every=6, **{**SMALL, "steps": 6})
    train(half, progress=False)
    resumed = train(ToyConfig(setpo=True, checkpoint_dir=str(tmp_path), checkpoint_every=6, **SMALL), progress=False)
    for a, b in zip(straight.policy.state_dict().values(), resumed.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert [h["reward"] for h in straight.history] == [h["reward"] for h in resumed.history]
    assert (tmp_path / "config.json").exists()


def test_every_preset_runs_with_and_without_setpo():
    for algo in ("grpo", "gspo", "dapo"):
        for setpo_on in (False, True):
            run = train(ToyConfig(algo=algo, setpo=setpo_on, **SMALL), progress=False)
            assert len(run.history) == SMALL["steps"]
            assert all(0.0 <= h["correct_mass"] <= 1.0 for h in run.history)


def test_lambda_zero_setpo_equals_grpo():
    a = train(ToyConfig(setpo=False, **SMALL), progress=False)
    b = train(ToyConfig(setpo=True, lam=0.0, **SMALL), progress=False)
    for x, y in zip(a.policy.state_dict().values(), b.policy.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y)


def test_covered_modes_threshold():
    run = train(ToyConfig(**SMALL), progress=False)
    masses = run.history[-1]["mode_mass"]
    assert toy_results._covered_modes(run, 1e-9) == [0, 1, 2, 3]
    assert toy_results._covered_modes(run, 1.0) == []
    assert all(masses[m] >= 0.05 for m in toy_results._covered_modes(run))


def test_compare_shows_one_progress_bar_over_all_runs(capsys):
    from setpo_lab.studies.toy import compare

    results = compare(ToyConfig(**SMALL), {"GRPO": {}, "SetPO": {"setpo": True}}, range(2))
    assert [len(v) for v in results.values()] == [2, 2]
    err = capsys.readouterr().err
    assert "toy runs" in err and f"{4 * SMALL['steps']}/{4 * SMALL['steps']}" in err
    compare(ToyConfig(**SMALL), {"GRPO": {}}, range(1), progress=False)
    assert capsys.readouterr().err == ""


def test_a_bad_or_repeated_lambda_is_refused_before_training():
    import math

    import pytest

    from setpo_lab.studies.toy import lambda_sweep
    from setpo_lab.studies.toy_config import ToyConfig

    for bad in (-1.0, math.nan, math.inf):
        for setpo_on in (True, False):  # a plain-GRPO config with a bad λ is refused too: it is what a sweep labels
            with pytest.raises(ValueError, match="lam"):
                ToyConfig(setpo=setpo_on, lam=bad)
    with pytest.raises(ValueError, match="repeats"):
        lambda_sweep(ToyConfig(steps=1), [0.5, 0.5], seeds=[0])
