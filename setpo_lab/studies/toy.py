"""The toy mode-collapse experiment: a small trajectory policy on the multi-modal bandit, trained with
GRPO / GSPO / DAPO, with or without SetPO's diversity marginal. One loop, one config, one seed.

Read ``train`` top to bottom: sample G trajectories per prompt, score them, turn rewards (and, for SetPO,
embeddings) into advantages with ``setpo.advantages``, and take clipped policy-gradient steps with
``setpo.losses``. Everything the notebooks plot is logged in ``ToyRun.history`` and ``ToyRun.snapshots``.

With ``checkpoint_dir`` a run saves every ``checkpoint_every`` steps (atomically) and a rerun resumes to the
same result as an uninterrupted run; a checkpoint made with a different configuration is refused. Training
runs torch on one thread whatever the caller set (restored afterwards): the policy is tiny, and a second
thread (e.g. left behind by UMAP's numba) makes it several times slower.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from setpo.envs.bandit import MultiModalBandit
from setpo.advantages import groups_with_signal, setpo_advantages
from setpo.losses import policy_loss
from setpo.metrics import mean_pairwise_similarity
from setpo.presets import get_preset
from setpo.records import markdown_table, progress_bar, write_json
from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.stages import StudyResult, check_same_config, chosen_stages, print_flushed, refusal, unreadable
from setpo_lab.studies.toy_config import REUSE_NEUTRAL_FIELDS, ToyConfig, ToyStudyConfig
from setpo_lab.studies.toy_results import coverage_rows, summary_rows, write_figure1


class _TrajectoryPolicy(nn.Module):
    """π(t_1..t_L | prompt) = Π_k π(t_k | prompt, t_<k): an MLP over one-hots of the prompt, the position and
    the prefix (later tokens zeroed), so every position is scored in one batched pass."""

    def __init__(self, num_prompts: int, vocab_size: int, traj_len: int, hidden: int = 64):
        super().__init__()
        self.num_prompts, self.vocab_size, self.traj_len = num_prompts, vocab_size, traj_len
        in_dim = num_prompts + traj_len + traj_len * vocab_size
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, vocab_size))

    def _inputs(self, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        n, L, V = tokens.shape[0], self.traj_len, self.vocab_size
        prefix = F.one_hot(tokens, V).float()                               # (N, L, V)
        causal = torch.tril(torch.ones(L, L), diagonal=-1)                  # position k sees tokens < k
        prefixes = (causal[None, :, :, None] * prefix[:, None]).reshape(n, L, L * V)
        pos = torch.eye(L).expand(n, L, L)
        prompt = F.one_hot(prompts, self.num_prompts).float()[:, None].expand(n, L, -1)
        return torch.cat([prompt, pos, prefixes], -1)

    def token_log_probs(self, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(N,) prompts, (N, L) tokens -> (N, L) log π(t_k | prompt, t_<k)."""
        logits = self.net(self._inputs(prompts, tokens))
        return logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        tokens = torch.zeros(len(prompts), self.traj_len, dtype=torch.long)
        for k in range(self.traj_len):
            probs = self.net(self._inputs(prompts, tokens))[:, k].softmax(-1)
            tokens[:, k] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return tokens

    @torch.no_grad()
    def sequence_probs(self, prompt: int) -> torch.Tensor:
        """Exact probability of every one of the vocab_size**traj_len sequences for one prompt."""
        V, L = self.vocab_size, self.traj_len
        grid = torch.cartesian_prod(*[torch.arange(V)] * L).reshape(-1, L)
        return self.token_log_probs(torch.full((len(grid),), prompt), grid).sum(-1).exp()


def _mode_mass(policy: _TrajectoryPolicy, world: MultiModalBandit) -> torch.Tensor:
    """(num_prompts, num_modes) exact probability mass the policy puts on each mode, per prompt."""
    c = world.config
    return torch.stack([
        torch.zeros(c.num_modes).index_add_(0, world.mode_table[p], policy.sequence_probs(p))
        for p in range(c.num_prompts)
    ])


@dataclass
class ToyRun:
    config: ToyConfig
    policy: _TrajectoryPolicy
    history: list[dict]      # one row of metrics per step
    snapshots: list[dict]    # {"step", "embeddings" (n, D), "modes" (n,), "tokens" (n, L)}


def _sample_batch(policy, world, cfg, gen):
    prompts = torch.randint(cfg.bandit.num_prompts, (cfg.groups_per_step,), generator=gen)
    prompts = prompts.repeat_interleave(cfg.group_size)
    tokens = policy.sample(prompts, gen)
    return prompts, tokens, world.rewards(prompts, tokens)


def _dynamic_sample(policy, world, cfg, gen):
    """DAPO: keep only groups whose rewards differ, drawing more batches to refill (at most max_resample)."""
    G, kept = cfg.group_size, []
    for _ in range(1 + cfg.max_resample):
        prompts, tokens, rewards = _sample_batch(policy, world, cfg, gen)
        signal = groups_with_signal(rewards, group_size=G)
        kept.append((prompts[signal], tokens[signal], rewards[signal]))
        if sum(len(k[0]) for k in kept) >= cfg.groups_per_step * G:
            break
    return tuple(torch.cat(parts)[: cfg.groups_per_step * G] for parts in zip(*kept, strict=True))


def _config_record(cfg: ToyConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg), default=str))


def _save(path: Path, step, policy, ref, opt, gen, history, snapshots, cfg):
    """One file holding everything a resume needs, in types ``torch.load(weights_only=True)`` accepts
    (tensors, numbers, strings, lists and dicts): the history and config go as JSON text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"step": step, "policy": policy.state_dict(), "ref": ref.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "history": json.dumps(history), "snapshots": snapshots,
                "config": json.dumps(_config_record(cfg))}, tmp)
    tmp.replace(path)  # atomic: an interrupted save never leaves a half-written checkpoint
    write_json(path.parent / "config.json", asdict(cfg))


def _load(path: Path, cfg: ToyConfig) -> dict:
    """The checkpoint at ``path``, checked against ``cfg``: a damaged file or one made with another
    configuration is a ValueError naming the file (and the fields that differ) and what to do. A file that
    cannot be loaded is refused with one message whatever its bytes (``stages.unreadable``): torch's own text
    varies with them and advises loading unsafely, which a file of unknown origin must never be."""
    try:
        state = torch.load(path, weights_only=True)
        state["history"], saved = json.loads(state["history"]), json.loads(state["config"])
    except Exception as e:  # noqa: BLE001 - truncated zip, planted pickle, old format: all unusable here
        raise unreadable(path, e, "delete it and rerun to start this run over", expected="toy checkpoint",
                         root=path.parent) from None
    remedy = "use another checkpoint_dir, or delete it and rerun to start over"
    check_same_config(saved, _config_record(cfg), REUSE_NEUTRAL_FIELDS, path, remedy)
    if state["step"] > cfg.steps:
        raise refusal(f"the checkpoint is at step {state['step']}, beyond steps={cfg.steps}", path, remedy)
    return state


def _snapshot(step, policy, world, cfg, gen) -> dict:
    prompts = torch.randint(cfg.bandit.num_prompts, (cfg.snapshot_samples,), generator=gen)
    tokens = policy.sample(prompts, gen)
    return {"step": step, "prompts": prompts, "tokens": tokens, "modes": world.modes(prompts, tokens),
            "embeddings": world.embeddings(prompts, tokens)}


def train(cfg: ToyConfig, progress=True) -> ToyRun:
    """Train one policy; ``progress``: True for a bar of its own, False for none, or a tqdm bar to advance
    one step per training step (``compare`` shares one bar across runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see the module docstring; the caller's setting comes back in finally
    bar = progress_bar(cfg.steps, cfg.name) if progress is True else (None if progress is False else progress)
    try:
        return _train(cfg, bar)
    finally:
        torch.set_num_threads(threads)
        if progress is True:
            bar.close()


def _train(cfg: ToyConfig, bar) -> ToyRun:
    preset = get_preset(cfg.algo)
    world = MultiModalBandit(cfg.bandit)
    torch.manual_seed(cfg.seed)
    # the policy, then the KL reference (initialised in that order from the seed, then made equal to the policy)
    policy, ref = (_TrajectoryPolicy(cfg.bandit.num_prompts, cfg.bandit.vocab_size, cfg.bandit.traj_len, cfg.hidden)
                   for _ in range(2))
    ref.load_state_dict(policy.state_dict())
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    history, snapshots, start = [], [], 0

    ckpt = Path(cfg.checkpoint_dir) / "checkpoint.pt" if cfg.checkpoint_dir else None
    if ckpt is not None and ckpt.exists():
        state = _load(ckpt, cfg)
        for key, part in (("policy", policy), ("ref", ref), ("opt", opt)):
            part.load_state_dict(state[key])
        gen.set_state(state["gen"])
        history, snapshots, start = state["history"], state["snapshots"], state["step"]

    G = cfg.group_size
    if bar is not None:
        bar.update(start)
    for step in range(start, cfg.steps):
        if step % cfg.snapshot_every == 0:
            snapshots.append(_snapshot(step, policy, world, cfg, gen))

        # 1. Rollouts: G trajectories per prompt, scored by the world.
        if preset.dynamic_sampling:
            prompts, tokens, rewards = _dynamic_sample(policy, world, cfg, gen)
        else:
            prompts, tokens, rewards = _sample_batch(policy, world, cfg, gen)
        emb = world.embeddings(prompts, tokens)

        # 2. Advantages: the base group estimator, plus λ·s_i for SetPO (s is logged either way).
        adv, s = rewards, rewards  # DAPO's dynamic sampling can leave no group with signal: nothing to learn
        if len(rewards):
            adv, s = setpo_advantages(rewards, emb, group_size=G, lam=cfg.lam if cfg.setpo else 0.0,
                                      estimator=cfg.estimator, return_marginals=True)

        # 3. Clipped policy-gradient updates on this batch.
        mask = torch.ones_like(tokens, dtype=torch.float32)
        with torch.no_grad():
            old_logp = policy.token_log_probs(prompts, tokens)
            ref_logp = ref.token_log_probs(prompts, tokens) if cfg.kl_coef else None
        metrics = {}
        for _ in range(cfg.updates_per_batch if len(rewards) else 0):
            logp = policy.token_log_probs(prompts, tokens)
            loss, metrics = policy_loss(preset, logp, old_logp, adv, mask, ref_log_prob=ref_logp,
                                        kl_coef=cfg.kl_coef)
            opt.zero_grad()
            loss.backward()
            opt.step()

        masses = _mode_mass(policy, world).mean(0)
        history.append({
            "step": step + 1,
            "reward": float(rewards.mean()) if len(rewards) else math.nan,
            "correct_mass": float(masses[list(world.correct_modes)].sum()),
            "mode_mass": masses.tolist(),
            "mean_s": float(s.mean()) if len(s) else math.nan,
            "pairwise_similarity": float(mean_pairwise_similarity(emb, group_size=G)) if len(emb) else math.nan,
            "groups": len(rewards) // G,
            **metrics,
        })
        if ckpt is not None and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
            _save(ckpt, step + 1, policy, ref, opt, gen, history, snapshots, cfg)
        if bar is not None:
            bar.update(1)

    if not snapshots or snapshots[-1]["step"] != cfg.steps:
        snapshots.append(_snapshot(cfg.steps, policy, world, cfg, gen))
    return ToyRun(cfg, policy, history, snapshots)


# ---- comparisons, tables and the demo -----------------------------------------------------------------

def compare(base: ToyConfig, variants: dict[str, dict], seeds, progress: bool = True) -> dict[str, list[ToyRun]]:
    """Train every variant (label -> config changes) from the same seeds and world, with one progress bar
    over all their steps (``progress=False``: none)."""
    seeds = list(seeds)
    configs = {label: [dataclasses.replace(base, seed=s, **changes) for s in seeds]
               for label, changes in variants.items()}
    bar = progress_bar(sum(c.steps for cs in configs.values() for c in cs), "toy runs") if progress else None

    def run(label: str, c: ToyConfig) -> ToyRun:
        if bar is not None:
            bar.set_postfix_str(f"{label}, seed {c.seed}", refresh=False)
        return train(c, progress=False if bar is None else bar)

    try:
        return {label: [run(label, c) for c in cs] for label, cs in configs.items()}
    finally:
        if bar is not None:
            bar.close()


DEMO_VARIANTS = {"GRPO": {"setpo": False}, "SetPO+GRPO": {"setpo": True}}


STAGES = ("train", "report")


def run_study(cfg: ToyStudyConfig, stages: Sequence[str] | None = None, *, log=print_flushed) -> StudyResult:
    """The toy study, in its two stages (None: both): "train" GRPO and SetPO+GRPO from the same seeds
    (``compare``), then "report": the coverage tables logged and Figure 1 written (``toy_results``). The runs
    live in memory only (seconds to make), so "report" needs "train" in the same call. Returns the runs by
    variant and, with "report", the two tables (``StudyResult``)."""
    stages = chosen_stages(stages, STAGES)
    if "train" not in stages:
        raise ValueError("the toy study keeps its runs in memory: stage 'report' needs stage 'train' in the same "
                         "call (stages=None runs both)")
    t0 = time.perf_counter()
    results = compare(cfg.base(), DEMO_VARIANTS, range(cfg.seeds))
    summary = {}
    if "report" in stages:
        summary = {"coverage": coverage_rows(results), "summary": summary_rows(results)}
        log(markdown_table(summary["coverage"]))
        log("")
        log(markdown_table(summary["summary"]))
        _, html, png = write_figure1(results, Path(cfg.out), cfg.figure_projection(),
                                     cfg.command + (" (smoke)" if cfg.smoke else ""))
        log(f"\nwrote {png} and {html}")
    return StudyResult("toy", Path(cfg.out), results, summary, time.perf_counter() - t0)


def lambda_sweep(base: ToyConfig, lams, seeds, threshold: float = 0.05) -> list[dict]:
    """Correct modes covered by SetPO+<algo> for each λ (λ = 0 is the base algorithm), over the same seeds."""
    lams = list(lams)
    if len(set(lams)) != len(lams):  # runs are keyed by λ: a repeated one would silently become one row
        raise ValueError(f"each λ once, please: {lams} repeats {sorted({x for x in lams if lams.count(x) > 1})}")
    results = compare(base, {lam: {"setpo": lam > 0, "lam": lam} for lam in lams}, seeds)
    return [{"lambda": row.pop("method"), **{k: v for k, v in row.items() if k != "seeds"}}
            for row in summary_rows(results, threshold)]


def _run(cfg: ToyStudyConfig, stages: Sequence[str], args) -> int:
    run_study(cfg, stages)
    return 0


#: ``python -m setpo_lab run toy --preset demo --out runs/demo --set seeds=5`` (``make demo`` runs the same study)
COMMAND = StudyCommand(
    "toy", {"demo": ToyStudyConfig, "smoke": lambda **kw: ToyStudyConfig(smoke=True, **kw)}, STAGES, _run,
    default_preset="demo", folder="out", default_out={"demo": "runs/demo", "smoke": "runs/demo"},
    fields=frozenset({"seeds", "projection"}), doc="GRPO vs SetPO+GRPO on the multi-modal bandit (Figure 1).")

if __name__ == "__main__":
    raise SystemExit(run_command(COMMAND))
