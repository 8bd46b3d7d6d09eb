"""A rubric-graded toy for SetGRPO: responses with a latent quality, two noisy graders, and re-grading.

The world is ours (SetGRPO's paper gives no toy). The policy and the training experiment that run on it live in
``setpo_lab.studies.rubric``. It is
built around one thing rubric-graded RL does: two graders score every response, and where a prompt's rubric
is underspecified each grader fills the gap with its own taste.

World (``RubricTask``). P prompts, each with M candidate responses. Response (x, a) has features
φ(x, a) ∈ R^d and a latent quality q(x, a) = sigmoid(κ · φ·w_true) ∈ (0, 1).

Graders. Grader k ∈ {A, B} scores clip(q + t_k(x, a) + ε, 0, 1) with ε ~ N(0, σ_k²), and with probability
``slip_prob[k]`` a grading slips instead: a uniform random score in [0, 1] (a misread rubric).
t_k = 0 on *clear* prompts; on *ambiguous* prompts (``ambiguous_fraction`` of them) it is the grader's own
taste, ``taste_scale`` · tanh(φ·u_k), with u_A and u_B independent random directions. Noise and slips are
fresh on every call; taste is not: re-grading reproduces it and only the graders' disagreement reveals it.
``regrade`` gives fresh gradings of the same responses (SetGRPO's default reference is the group advantage
of their mean); ``expert_grade`` is a careful third grader (no taste, no slips), to try a different
reference (``TrainConfig.reference = "expert"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from setpo.envs._checks import finite_real, whole_number

__all__ = ["RubricTask", "RubricToyConfig"]

#: Most numbers one of the world's tensors may hold (features P × M × d, a regrade's times × N × 2): 2**28 float64
#: is 2 GiB; a bigger request is refused by name, not met as an out-of-memory.
MAX_ENTRIES = 1 << 28


@dataclass
class RubricToyConfig:
    """The rubric world.

    n_prompts: P prompts; n_responses: M candidate responses per prompt; feature_dim: d.
    quality_scale: κ, how sharply the latent quality follows φ·w_true.
    ambiguous_fraction: share of prompts whose rubric leaves room for the graders' taste.
    taste_scale: size of each grader's taste on those prompts, in score units (scores lie in [0, 1]).
    grader_noise: Gaussian noise std (σ_A, σ_B) of the two graders, fresh on every call.
    slip_prob: per-grading probability that a grader slips and returns a uniform random score.
    expert_noise: noise std of the careful expert grader (used only if asked for as the reference).
    """

    n_prompts: int = 64
    n_responses: int = 16
    feature_dim: int = 8
    quality_scale: float = 2.0
    ambiguous_fraction: float = 0.5
    taste_scale: float = 1.0
    grader_noise: tuple[float, float] = (0.05, 0.05)
    slip_prob: tuple[float, float] = (0.02, 0.02)
    expert_noise: float = 0.05

    def __post_init__(self):
        for name, low in (("n_prompts", 1), ("n_responses", 2), ("feature_dim", 1)):
            setattr(self, name, whole_number(getattr(self, name), name, low))
        # the real-valued fields are checked, not converted (the values stay as given, in records too)
        finite_real(self.quality_scale, "quality_scale")
        finite_real(self.ambiguous_fraction, "ambiguous_fraction", 0, 1)
        finite_real(self.taste_scale, "taste_scale", 0)
        finite_real(self.expert_noise, "expert_noise", 0)
        if self.n_prompts * self.n_responses * self.feature_dim > MAX_ENTRIES:
            raise ValueError(f"n_prompts × n_responses × feature_dim = "
                             f"{self.n_prompts * self.n_responses * self.feature_dim} exceeds {MAX_ENTRIES} (2**28), "
                             f"the most features the world builds")
        for name, high in (("grader_noise", None), ("slip_prob", 1)):
            pair = getattr(self, name)
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise ValueError(f"{name} needs one value per grader (two graders), got {pair!r:.80}")
            for i, v in enumerate(pair):
                finite_real(v, f"{name}[{i}]", 0, high)
            setattr(self, name, tuple(pair))  # a tuple: the pair cannot change after this check
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, name, value):
        # a field set after construction is checked as at construction (the world reads its config when grading)
        if self.__dict__.get("_checked") and name in {f.name for f in dataclasses.fields(self)}:
            value = getattr(dataclasses.replace(self, **{name: value}), name)
        object.__setattr__(self, name, value)


def _times(times: int) -> int:
    try:
        return whole_number(times, "times", 1)
    except ValueError:
        raise ValueError(f"times must be a positive integer, got {times!r:.80}") from None


def _check_size(entries: int, what: str) -> None:
    if entries > MAX_ENTRIES:
        raise ValueError(f"{what} = {entries} exceeds {MAX_ENTRIES} (2**28), the most one call returns")


def _check_generator(gen) -> None:
    if not isinstance(gen, torch.Generator):  # noise and slips are drawn from it: a run is seeded through it
        raise ValueError(f"gen must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), got "
                         f"{type(gen).__name__}")


class RubricTask:
    """Prompts, responses, latent quality and two noisy graders; seeded, float64."""

    def __init__(self, config: RubricToyConfig | None = None, seed: int = 0):
        if config is not None and not isinstance(config, RubricToyConfig):
            raise ValueError(f"config must be a RubricToyConfig, got {type(config).__name__}")
        # its own copy: a later change to the caller's config cannot make the world disagree with its features
        self.config = cfg = dataclasses.replace(config) if config is not None else RubricToyConfig()
        gen = torch.Generator().manual_seed(whole_number(seed, "seed", 0))
        p, m, d = cfg.n_prompts, cfg.n_responses, cfg.feature_dim
        unit = lambda v: v / v.norm()  # noqa: E731
        self.features = torch.randn(p, m, d, generator=gen, dtype=torch.float64)          # φ (P, M, d)
        self.w_true = unit(torch.randn(d, generator=gen, dtype=torch.float64))
        self.quality = torch.sigmoid(cfg.quality_scale * self.features @ self.w_true)      # q (P, M)
        self.ambiguous = torch.zeros(p, dtype=torch.bool)
        self.ambiguous[torch.randperm(p, generator=gen)[:int(round(cfg.ambiguous_fraction * p))]] = True
        tastes = torch.stack([unit(torch.randn(d, generator=gen, dtype=torch.float64)) for _ in range(2)])
        # each grader's own preference, on ambiguous prompts only: (P, M, 2)
        self.taste = cfg.taste_scale * torch.tanh(self.features @ tastes.T) * self.ambiguous[:, None, None]

    def _pairs(self, prompts, responses) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) prompt ids and (N,) response ids, checked: integers in range (a negative id would wrap around to
        the last prompt), one response per prompt id."""
        out = []
        for name, ids, n in (("prompts", prompts, self.config.n_prompts),
                             ("responses", responses, self.config.n_responses)):
            want = f"{name} must be a 1-D sequence of integer ids in [0, {n})"
            try:
                t = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(np.asarray(ids))
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(f"{want}, got {type(ids).__name__}") from None
            if t.dtype == torch.bool or t.is_floating_point() or t.is_complex() or t.ndim != 1:
                raise ValueError(f"{want}, got dtype {t.dtype} and shape {tuple(t.shape)}")
            if bool(((t < 0) | (t >= n)).any()):
                raise ValueError(f"{want}, got {t[(t < 0) | (t >= n)][0].item()}")
            out.append(t.long())
        if out[0].shape != out[1].shape:
            raise ValueError(f"prompts and responses pair up one to one, got {out[0].shape[0]} prompt ids and "
                             f"{out[1].shape[0]} response ids")
        return out[0], out[1]

    def grade(self, prompts: torch.Tensor, responses: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Both graders' scores of responses[i] to prompts[i]: (N, 2) in [0, 1]."""
        prompts, responses = self._pairs(prompts, responses)
        _check_generator(gen)
        mean = self.quality[prompts, responses][:, None] + self.taste[prompts, responses]
        sd = torch.tensor(self.config.grader_noise, dtype=torch.float64)
        noisy = (mean + sd * torch.randn(mean.shape, generator=gen, dtype=torch.float64)).clamp(0.0, 1.0)
        slip = torch.rand(mean.shape, generator=gen, dtype=torch.float64) < torch.tensor(self.config.slip_prob)
        return torch.where(slip, torch.rand(mean.shape, generator=gen, dtype=torch.float64), noisy)

    def regrade(self, prompts, responses, times: int, gen: torch.Generator) -> torch.Tensor:
        """``times`` fresh gradings of the same responses by both graders: (times, N, 2)."""
        prompts, responses = self._pairs(prompts, responses)
        times = _times(times)
        _check_size(times * prompts.shape[0] * 2, "times × N × 2 gradings")
        return torch.stack([self.grade(prompts, responses, gen) for _ in range(times)])

    def expert_grade(self, prompts, responses, times: int, gen: torch.Generator) -> torch.Tensor:
        """``times`` gradings by a careful expert (no taste, no slips, noise ``expert_noise``): (times, N)."""
        prompts, responses = self._pairs(prompts, responses)
        q = self.quality[prompts, responses]
        times = _times(times)
        _check_size(times * q.shape[0], "times × N gradings")
        _check_generator(gen)
        noise = torch.randn((times, q.shape[0]), generator=gen, dtype=torch.float64)
        return (q + self.config.expert_noise * noise).clamp(0.0, 1.0)
