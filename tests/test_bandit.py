"""The multi-modal bandit: gymnasium contract, determinism, the paper's geometry."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import setpo.envs  # noqa: F401  (registers the ids)
from setpo.envs.bandit import BanditConfig, MultiModalBandit, MultiModalBanditEnv


def test_check_env_passes():
    check_env(gym.make("setpo/MultiModalBandit-v0").unwrapped)
    check_env(MultiModalBanditEnv(num_prompts=3))


def test_seeded_episodes_are_deterministic():
    def episode(seed):
        env = MultiModalBanditEnv(num_prompts=5)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        action = env.action_space.sample()
        return obs, tuple(action), env.step(action)[1]
    assert episode(7) == episode(7)


def test_paper_defaults_and_geometry():
    w = MultiModalBandit()
    c = w.config
    assert (c.num_modes, c.num_correct, c.embed_dim) == (12, 4, 50)
    assert w.correct_modes == (0, 1, 2, 3)
    grid = torch.cartesian_prod(*[torch.arange(c.vocab_size)] * c.traj_len)
    prompts = torch.zeros(len(grid), dtype=torch.long)
    modes = w.modes(prompts, grid)
    counts = torch.bincount(modes, minlength=c.num_modes)
    assert counts.min() >= 2 and counts.max() - counts.min() <= 1  # several surface forms per mode, balanced
    assert torch.equal(w.rewards(prompts, grid), (modes < 4).float())
    emb = w.embeddings(prompts, grid)
    unit = emb / emb.norm(dim=-1, keepdim=True)
    cos_to_own_centre = (unit * w.centres[modes]).sum(-1)
    assert float(cos_to_own_centre.min()) > 0.8  # trajectories scatter close around their mode's centre
    same = modes[:, None] == modes[None, :]
    cos = (unit @ unit.T)
    assert float(cos[same].mean()) > float(cos[~same].mean()) + 0.5


def test_step_info_and_errors():
    env = MultiModalBanditEnv()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(np.array([0, 1, 2]))
    assert terminated and not truncated
    assert reward == (1.0 if info["correct"] else 0.0) and info["embedding"].shape == (50,)
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        env.step(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="tokens must lie"):
        env.world.modes(torch.tensor([0]), torch.tensor([[0, 1, 9]]))
    with pytest.raises(ValueError, match="num_correct"):
        BanditConfig(num_correct=13)
