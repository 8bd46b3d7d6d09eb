"""The multi-modal bandit of the SetPO paper's Figure 1, with token trajectories instead of single arms.

The paper's setting: 12 discrete semantic modes, only the first 4 rewarded, each mode a 50-dim embedding,
cosine similarity. What the paper leaves open is ours (all configurable in ``BanditConfig``):

- A rollout is a short token sequence (``traj_len`` tokens from ``vocab_size``), so that a policy collapses
  over trajectories the way a language model does. A fixed, seeded table maps each of the vocab_size**traj_len
  sequences to a mode, differently for each prompt, so every mode has many surface forms.
- A trajectory's embedding is its mode centre plus a fixed per-sequence offset (``surface_noise``), so the
  sampled embeddings scatter around their mode's centre: the clouds and stars of Figure 1. Centres are random
  Gaussian directions, nearly orthogonal in 50 dimensions, so the clamped cosine between modes is small.
- Reward: ``correct_reward[m]`` for the correct modes (default 1.0 each), 0 otherwise. Several modes are
  equally good; GRPO's policy gradient is rich-get-richer among them (a sampled correct mode's logits rise in
  proportion to how often it is sampled), which is the collapse Figure 1 shows.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from setpo.envs._checks import check_options, check_seed, whole_number


#: Most surface forms (vocab_size**traj_len) a world tabulates; each has an embed_dim-vector offset.
MAX_SEQUENCES = 1 << 20
#: Most numbers in one of the world's tables (num_prompts × surface forms, surface forms × embed_dim; the mode
#: centres are smaller, as there are no more modes than surface forms): 2**28 is 1 GiB of float32; a bigger world is refused at construction, not met as an out-of-memory.
MAX_TABLE_ENTRIES = 1 << 28
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _whole_numbers(x, name: str) -> torch.Tensor:
    """x as a long tensor, refusing what a cast would silently change (1.9 -> 1, NaN, bool, complex)."""
    try:
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} must be integer ids, got {type(x).__name__}: {err}") from None
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be integer ids, got dtype {t.dtype}")
    if t.is_floating_point() and not bool((torch.isfinite(t) & (t == t.round())).all()):
        raise ValueError(f"{name} must be whole numbers, got non-integer values")
    return t.long()


@dataclass(frozen=True)
class BanditConfig:
    num_modes: int = 12          # semantic modes (paper: 12)
    num_correct: int = 4         # the first num_correct modes are rewarded (paper: 4)
    embed_dim: int = 50          # mode embedding dimension (paper: 50)
    vocab_size: int = 6          # tokens per position
    traj_len: int = 3            # tokens per trajectory: vocab_size**traj_len surface forms in all
    num_prompts: int = 1         # contexts; each has its own sequence -> mode table
    surface_noise: float = 0.45  # norm of a surface form's offset relative to its unit mode centre
    correct_reward: tuple = ()   # per correct mode; empty = 1.0 for each
    world_seed: int = 0          # geometry and tables; the policy's seed is separate

    def __post_init__(self):
        for name in ("num_modes", "num_correct", "embed_dim", "vocab_size", "traj_len", "num_prompts", "world_seed"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {v!r}")
            if v < (0 if name == "world_seed" else 1):
                raise ValueError(f"{name} must be {'>= 0' if name == 'world_seed' else '>= 1'}, got {v}")
        if not _is_real(self.surface_noise) or not math.isfinite(self.surface_noise) or self.surface_noise < 0:
            raise ValueError(f"surface_noise must be a finite number >= 0, got {self.surface_noise!r}")
        if not isinstance(self.correct_reward, (tuple, list)):
            raise ValueError(f"correct_reward must be a tuple of numbers, got {type(self.correct_reward).__name__}")
        if not all(_is_real(r) and math.isfinite(r) for r in self.correct_reward):
            raise ValueError(f"correct_reward must hold finite numbers, got {self.correct_reward!r}")
        # the world tabulates every surface form: keep the table (and its embeddings) a sane size; the logarithm
        # first, so that vocab_size**traj_len is never computed for a huge traj_len (a big-integer power can hang)
        if self.traj_len * math.log2(self.vocab_size) > math.log2(MAX_SEQUENCES) + 1 or \
                self.vocab_size ** self.traj_len > MAX_SEQUENCES:
            raise ValueError(f"vocab_size**traj_len = {self.vocab_size}**{self.traj_len} exceeds {MAX_SEQUENCES} "
                             f"surface forms, which the world tabulates")
        if not 0 < self.num_correct <= self.num_modes:
            raise ValueError(f"need 0 < num_correct <= num_modes, got {self.num_correct}, {self.num_modes}")
        if self.vocab_size ** self.traj_len < self.num_modes:
            raise ValueError("vocab_size**traj_len must be at least num_modes so every mode has a surface form")
        if self.correct_reward and len(self.correct_reward) != self.num_correct:
            raise ValueError(f"correct_reward needs {self.num_correct} values, got {len(self.correct_reward)}")
        # rewards and embeddings are float32: a value beyond its range would become inf
        if self.surface_noise > _FLOAT32_MAX / 2 or any(abs(r) > _FLOAT32_MAX for r in self.correct_reward):
            raise ValueError(f"surface_noise and correct_reward must fit float32 (|x| <= {_FLOAT32_MAX / 2:.3g} and "
                             f"{_FLOAT32_MAX:.3g}), got {self.surface_noise!r}, {self.correct_reward!r}")
        sequences = self.vocab_size ** self.traj_len
        for what, entries in (("num_prompts × vocab_size**traj_len", self.num_prompts * sequences),
                              ("vocab_size**traj_len × embed_dim", sequences * self.embed_dim)):
            if entries > MAX_TABLE_ENTRIES:
                raise ValueError(f"{what} = {entries} numbers exceeds {MAX_TABLE_ENTRIES} (2**28), the largest "
                                 f"table the world builds")


def _config(config, overrides: dict) -> BanditConfig:
    """``config`` (default ``BanditConfig()``) with ``overrides`` applied; unknown fields are named."""
    if config is None:
        config = BanditConfig()
    if not isinstance(config, BanditConfig):
        raise ValueError(f"config must be a BanditConfig, got {type(config).__name__}")
    fields = [f.name for f in dataclasses.fields(BanditConfig)]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise ValueError(f"BanditConfig has no field(s) {unknown}; the fields are {fields}")
    return dataclasses.replace(config, **overrides) if overrides else config


class MultiModalBandit:
    """The world: tables and geometry, vectorised over batches of (prompt, token sequence)."""

    def __init__(self, config: BanditConfig = BanditConfig()):
        self.config = c = _config(config, {})
        rng = np.random.default_rng(c.world_seed)
        self.num_sequences = c.vocab_size ** c.traj_len
        # Balanced table: each mode gets the same number of surface forms (± 1), shuffled per prompt.
        base = np.arange(self.num_sequences) % c.num_modes
        self.mode_table = torch.as_tensor(np.stack([rng.permutation(base) for _ in range(c.num_prompts)]))
        centres = rng.standard_normal((c.num_modes, c.embed_dim))
        self.centres = torch.as_tensor(centres / np.linalg.norm(centres, axis=1, keepdims=True), dtype=torch.float32)
        offsets = rng.standard_normal((self.num_sequences, c.embed_dim))
        offsets *= c.surface_noise / np.linalg.norm(offsets, axis=1, keepdims=True)
        self.offsets = torch.as_tensor(offsets, dtype=torch.float32)
        rewards = torch.zeros(c.num_modes)
        rewards[: c.num_correct] = torch.tensor(c.correct_reward or (1.0,) * c.num_correct)
        self.mode_reward = rewards
        self.correct_modes = tuple(range(c.num_correct))
        self._place = c.vocab_size ** torch.arange(c.traj_len - 1, -1, -1)

    def sequence_id(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, traj_len) tokens -> (N,) sequence ids in [0, vocab_size**traj_len)."""
        tokens = _whole_numbers(tokens, "tokens")
        if tokens.ndim != 2 or tokens.shape[1] != self.config.traj_len:
            raise ValueError(f"tokens must have shape (N, {self.config.traj_len}), got {tuple(tokens.shape)}")
        if bool(((tokens < 0) | (tokens >= self.config.vocab_size)).any()):
            raise ValueError(f"tokens must lie in [0, {self.config.vocab_size})")
        return (tokens.long() * self._place).sum(-1)

    def _check_prompts(self, prompts) -> torch.Tensor:
        prompts = _whole_numbers(prompts, "prompt ids")
        if bool(((prompts < 0) | (prompts >= self.config.num_prompts)).any()):
            raise ValueError(f"prompt ids must lie in [0, {self.config.num_prompts})")
        return prompts

    def modes(self, prompts, tokens) -> torch.Tensor:
        """(N,) prompt ids (or one id for every row) and (N, traj_len) tokens -> (N,) mode ids."""
        prompts, sequences = self._check_prompts(prompts), self.sequence_id(tokens)
        if prompts.ndim > 1 or (prompts.ndim == 1 and prompts.shape[0] != sequences.shape[0]):
            raise ValueError(f"prompt ids must be one id or one per trajectory ({sequences.shape[0]}), got shape "
                             f"{tuple(prompts.shape)}")
        return self.mode_table[prompts, sequences]

    def rewards(self, prompts, tokens) -> torch.Tensor:
        return self.mode_reward[self.modes(prompts, tokens)]

    def embeddings(self, prompts, tokens) -> torch.Tensor:
        """(N, embed_dim): mode centre + the sequence's fixed surface offset."""
        return self.centres[self.modes(prompts, tokens)] + self.offsets[self.sequence_id(tokens)]


class MultiModalBanditEnv(gym.Env):
    """One-step episodes: observe a prompt id, act with a whole token trajectory, get its mode's reward.

    info holds the trajectory's ``mode``, ``embedding``, ``correct`` flag; the world (``env.unwrapped.world``)
    exposes the correct-mode set and the mode centres. An action is ``traj_len`` whole-number token ids in
    range (1.9, None, dicts and out-of-range ids are ValueErrors, never rounded); stepping before ``reset``
    or after the episode ended raises ``gymnasium.error.ResetNeeded``, as Countdown does. ``reset`` takes
    ``options={"prompt": i}`` to pick the prompt (like Countdown's ``{"index": i}``).
    """

    metadata = {"render_modes": []}

    def __init__(self, config: BanditConfig | None = None, **overrides):
        """config: the world (default ``BanditConfig()``); overrides: BanditConfig fields to change in it."""
        self.world = MultiModalBandit(_config(config, overrides))
        c = self.world.config
        self.observation_space = spaces.Discrete(c.num_prompts)
        self.action_space = spaces.MultiDiscrete([c.vocab_size] * c.traj_len)
        self._prompt = None

    def reset(self, *, seed=None, options=None):
        """Draw the prompt id with the env's generator, or take ``options={"prompt": i}``, i in [0, num_prompts).

        seed: None or an integer >= 0. A bad seed, an unknown option or a prompt id out of range is a ValueError
        that names it, raised before anything changes.
        """
        seed = check_seed(seed)
        options = check_options(options, ("prompt",))
        prompt = None
        if "prompt" in options:
            prompt = whole_number(options["prompt"], "options['prompt']", 0, self.world.config.num_prompts)
        super().reset(seed=seed)
        self._prompt = int(self.np_random.integers(self.world.config.num_prompts)) if prompt is None else prompt
        return self._prompt, {}

    def _tokens(self, action) -> torch.Tensor:
        """The action as (1, traj_len) token ids: integer-valued numbers in range, nothing rounded. Every
        refusal says what an action is: ``traj_len`` whole-number token ids in [0, vocab_size)."""
        c = self.world.config
        want = f"action must be {c.traj_len} whole-number token ids in [0, {c.vocab_size})"
        try:
            arr = np.asarray(action)
        except (TypeError, ValueError, RuntimeError) as err:  # ragged lists, tensors numpy cannot read
            raise ValueError(f"{want}, got {action!r:.80} ({type(err).__name__})") from None
        if arr.dtype.kind not in "iuf" or arr.shape != (c.traj_len,):
            raise ValueError(f"{want}, got {action!r:.80}")
        if isinstance(action, (list, tuple)) and any(isinstance(a, (bool, np.bool_)) for a in action):
            raise ValueError(f"{want}, got {action!r:.80} (True/False are not token ids)")  # numpy casts them
        if arr.dtype.kind == "f" and not bool((np.isfinite(arr) & (arr == np.round(arr))).all()):
            raise ValueError(f"{want} (whole numbers, not rounded), got {action!r:.80}")
        if bool(((arr < 0) | (arr >= c.vocab_size)).any()):
            raise ValueError(f"{want}: tokens must lie in [0, {c.vocab_size}), got {action!r:.80}")
        return torch.as_tensor(arr.astype(np.int64))[None]

    def step(self, action):
        if self._prompt is None:
            raise gym.error.ResetNeeded("call reset() before step(): bandit episodes last one step")
        tokens = self._tokens(action)
        prompt = torch.tensor([self._prompt])
        mode = int(self.world.modes(prompt, tokens)[0])
        info = {
            "mode": mode,
            "correct": mode in self.world.correct_modes,
            "embedding": self.world.embeddings(prompt, tokens)[0].numpy(),
        }
        obs = self._prompt
        self._prompt = None
        return obs, float(self.world.mode_reward[mode]), True, False, info
