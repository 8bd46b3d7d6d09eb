"""SetGRPO on the rubric-graded toy (``setpo.envs.rubric``): a linear softmax policy, GRPO vs SetGRPO training, and
the coverage, risk and invariance studies of notebook 05.

Policy (``LinearSoftmaxPolicy``). π(a | x) ∝ exp(φ(x, a)·θ), one θ ∈ R^d shared by all prompts. Its
per-response gradient feature is exact: ∇θ log π(a | x) = φ(x, a) − Σ_b π(b | x) φ(x, b) (a response is
one action, so there is no length to normalise by).

Training (``_train_method``). Each step samples ``batch_prompts`` prompts and G responses each, grades them with
both graders and takes an Adam step on −(1/N) Σ_i c_i log π(a_i | x_i), where c is
- "grpo": GRPO's advantage of the mean grader score (the mean of ``grpo_gradings`` gradings per grader), or
- "setgrpo": SetGRPO's coefficients, recalibrated every K steps on ``n_cal_groups`` fresh groups from the
  current policy (graded, then re-graded ``n_regrades`` times per grader for the reference). Calibration
  groups are never used for updates; their grader calls are counted.
The true-quality reward is exact: the policy's expected q over all prompts.

``compare_methods`` runs GRPO, GRPO with at least SetGRPO's grader budget (more gradings averaged per response) and
SetGRPO over seeds and prints the table. Run: ``python -m setpo_lab run rubric --set seeds=5``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, replace

import torch

from setpo.envs.rubric import RubricTask, RubricToyConfig
from setpo.advantages import group_advantages
from setpo.groups import Groups
from setpo.setgrpo import (
    SetGRPO,
    SetGRPOConfig,
    conformal_quantile,
    conformal_scores,
    gram_matrices,
    joint_coefficient_set,
    reference_coefficients,
    reversal_indicators,
    safe_recovery,
)
from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.rubric_config import RubricStudyConfig, TrainConfig
from setpo_lab.studies.rubric_results import format_table
from setpo_lab.studies.stages import StudyResult, chosen_stages, print_flushed

__all__ = ["LinearSoftmaxPolicy", "RubricStudyConfig", "TrainConfig", "compare_methods", "coverage_study",
           "draw_groups", "format_table", "invariance_table", "risk_study", "run_study"]


class LinearSoftmaxPolicy:
    """π(a | x) ∝ exp(φ(x, a)·θ) over a task's candidate responses; θ (d,) starts at 0 (uniform policy)."""

    def __init__(self, task: RubricTask):
        self.task = task
        self.theta = torch.zeros(task.config.feature_dim, dtype=torch.float64, requires_grad=True)

    def log_probs(self, prompts: torch.Tensor | None = None) -> torch.Tensor:
        """(P', M) log π(· | x) for the given prompts (all prompts when None)."""
        phi = self.task.features if prompts is None else self.task.features[prompts]
        return torch.log_softmax(phi @ self.theta, -1)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, group_size: int, gen: torch.Generator) -> torch.Tensor:
        """(len(prompts) · G,) responses; rows are contiguous groups of G per prompt."""
        probs = self.log_probs(prompts).exp()
        return torch.multinomial(probs, group_size, replacement=True, generator=gen).reshape(-1)

    @torch.no_grad()
    def grad_features(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Exact ∇θ log π(a_i | x_i) = φ(x_i, a_i) − E_π φ(x_i, ·): (N, d)."""
        probs = self.log_probs(prompts).exp()                                            # (N, M)
        phi = self.task.features[prompts]                                                # (N, M, d)
        return phi[torch.arange(len(prompts)), responses] - (probs[..., None] * phi).sum(1)

    @torch.no_grad()
    def true_quality(self) -> float:
        """Expected latent quality of the policy's responses, averaged over all prompts (exact)."""
        return float((self.log_probs().exp() * self.task.quality).sum(-1).mean())


def draw_groups(task: RubricTask, policy: LinearSoftmaxPolicy, n_groups: int, group_size: int,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_groups`` prompts drawn uniformly and ``group_size`` responses each from the current policy:
    (prompts, responses), both (n_groups · G,), rows in contiguous groups of G (one prompt per group)."""
    heads = torch.randint(task.config.n_prompts, (n_groups,), generator=gen)
    return heads.repeat_interleave(group_size), policy.sample(heads, group_size, gen)


def _train_method(method: str = "setgrpo", task_config: RubricToyConfig | None = None,
                  train_config: TrainConfig | None = None, seed: int = 0) -> dict:
    """Train the linear policy on the toy with "grpo" or "setgrpo"; return the history.

    The world and the sampling are both seeded from ``seed``, so two methods run with the same seed see the
    same prompts, graders and first batch.
    History (one value per step): true_quality (before the step's update), accepted_ratio,
    mean_recovery_ratio (over accepted groups), coef_norm (RMS coefficient), tau and q (NaN for GRPO);
    then final_true_quality, best_true_quality (the optimum), grader_calls (total, calibration included),
    and config.
    """
    if method not in ("grpo", "setgrpo"):
        raise ValueError(f"method must be 'grpo' or 'setgrpo', got {method!r}")
    tc = train_config or TrainConfig()
    task = RubricTask(task_config, seed=seed)
    policy = LinearSoftmaxPolicy(task)
    opt = torch.optim.Adam([policy.theta], lr=tc.lr)
    gen = torch.Generator().manual_seed(10_000 + seed)
    g = tc.group_size
    sg = SetGRPO(tc.setgrpo) if method == "setgrpo" else None
    keys = ("true_quality", "accepted_ratio", "mean_recovery_ratio", "coef_norm", "tau", "q")
    hist: dict = {k: [] for k in keys}
    calls = 0
    for step in range(tc.steps):
        hist["true_quality"].append(policy.true_quality())
        if sg is not None and sg.needs_calibration(step):
            cp, cr = draw_groups(task, policy, tc.n_cal_groups, g, gen)
            scores = task.grade(cp, cr, gen)
            if tc.reference == "expert":
                regrades = task.expert_grade(cp, cr, tc.n_regrades, gen)
            else:
                regrades = task.regrade(cp, cr, tc.n_regrades, gen)
                calls += regrades.numel()
            calls += scores.numel()
            sg.calibrate(scores, reference_coefficients(regrades, group_size=g), policy.grad_features(cp, cr),
                         group_size=g, step=step)
        prompts, responses = draw_groups(task, policy, tc.batch_prompts, g, gen)
        if sg is None:
            scores = task.regrade(prompts, responses, tc.grpo_gradings, gen)            # (R, N, 2)
            coef = group_advantages(scores.mean((0, 2)), group_size=g)
            acc, eta, tau, q = 1.0, math.nan, math.nan, math.nan
        else:
            scores = task.grade(prompts, responses, gen)
            out = sg.coefficients(scores, policy.grad_features(prompts, responses), group_size=g)
            coef, acc, eta, tau, q = out.coef, out.accepted_ratio, out.mean_recovery_ratio, out.tau, out.q
        calls += scores.numel()
        logp = policy.log_probs(prompts).gather(1, responses[:, None])[:, 0]
        loss = -(coef.detach() * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for k, v in zip(keys[1:], (acc, eta, float(coef.double().pow(2).mean().sqrt()), tau, q), strict=True):
            hist[k].append(v)
    hist.update(final_true_quality=policy.true_quality(), best_true_quality=float(task.quality.max(-1).values.mean()),
                grader_calls=calls,
                config={"method": method, "seed": seed, "task": asdict(task.config), "train": asdict(tc)})
    return hist


def compare_methods(seeds=range(5), task_config: RubricToyConfig | None = None,
                    train_config: TrainConfig | None = None, verbose: bool = True,
                    keep_history: bool = False, log=print_flushed) -> list[dict]:
    """GRPO vs SetGRPO on the same noisy graders, one world per seed; with ``verbose``, ``log`` a line per seed
    and a markdown table.

    Three runs per seed: GRPO (one grading per grader), GRPO with at least SetGRPO's grader budget per step
    (``grpo_gradings`` raised until it matches; more gradings average out noise and slips, not taste), and
    SetGRPO. Returns one row per seed with their final true-quality rewards, the optimum, SetGRPO − GRPO,
    SetGRPO's mean accepted-group ratio and the grader calls of each run (and, with ``keep_history``, the
    three runs' histories under "history": {"grpo", "grpo_matched", "setgrpo"}).
    """
    tc = train_config or TrainConfig()
    matched = replace(tc, grpo_gradings=math.ceil(tc.grader_calls_per_step("setgrpo")
                                                  / tc.grader_calls_per_step("grpo")))
    rows = []
    for s in seeds:
        h_g = _train_method("grpo", task_config, tc, seed=s)
        h_m = _train_method("grpo", task_config, matched, seed=s)
        h_s = _train_method("setgrpo", task_config, tc, seed=s)
        rows.append({"seed": s, "grpo": h_g["final_true_quality"], "grpo_matched": h_m["final_true_quality"],
                     "setgrpo": h_s["final_true_quality"], "best": h_s["best_true_quality"],
                     "gain": h_s["final_true_quality"] - h_g["final_true_quality"],
                     "accepted": sum(h_s["accepted_ratio"]) / len(h_s["accepted_ratio"]),
                     "calls": (h_g["grader_calls"], h_m["grader_calls"], h_s["grader_calls"]),
                     "matched_gradings": matched.grpo_gradings,
                     **({"history": {"grpo": h_g, "grpo_matched": h_m, "setgrpo": h_s}} if keep_history else {})})
        if verbose:  # a line per seed: a long comparison shows it is moving
            log(f"seed {s}: GRPO {rows[-1]['grpo']:.3f}, GRPO (matched budget) {rows[-1]['grpo_matched']:.3f}, "
                f"SetGRPO {rows[-1]['setgrpo']:.3f}")
    if verbose:
        log(format_table(rows))
    return rows


# ----------------------------------------------------------------------------------------------------------
# diagnostics behind notebook 05 (the paper's Figure 9 and Table 7, in miniature)


def _grader(task_config: RubricToyConfig | None, seed: int, theta_scale: float, group_size: int):
    """What every diagnostic draws from: ``graded(n_groups)``, ``n_groups`` fresh groups of a policy part-way to the
    optimum of the world of ``seed``, θ = theta_scale · w_true (0 is the uniform starting policy), graded and
    re-graded twice per grader: (scores, reference coefficients, gradient features); sampled from a generator
    seeded ``seed + 1``."""
    task = RubricTask(task_config, seed=seed)
    policy = LinearSoftmaxPolicy(task)
    with torch.no_grad():
        policy.theta.copy_(theta_scale * task.w_true)
    gen = torch.Generator().manual_seed(seed + 1)

    def graded(n_groups: int):
        p, r = draw_groups(task, policy, n_groups, group_size, gen)
        scores = task.grade(p, r, gen)
        ref = reference_coefficients(task.regrade(p, r, 2, gen), group_size=group_size)
        return scores, ref, policy.grad_features(p, r)

    return graded


def coverage_study(alphas=(0.05, 0.1, 0.2), trials: int = 300, n_cal: int = 39, seed: int = 0,
                   theta_scale: float = 2.0, task_config: RubricToyConfig | None = None, group_size: int = 8):
    """Empirical coverage of the joint box over ``trials`` independent calibrations of ``n_cal`` groups.

    Returns one row per α: alpha, target 1 − α, coverage (share of fresh groups whose a* fell in the box),
    and the finite-sample upper bound 1 − α + 1/(n_cal + 1).
    """
    scores, ref, _ = _grader(task_config, seed, theta_scale, group_size)(trials * (n_cal + 1))
    centre, sigma, _ = joint_coefficient_set(scores, group_size=group_size)
    s = conformal_scores(ref, centre, sigma, group_size=group_size).reshape(trials, n_cal + 1)

    def coverage(alpha: float) -> float:  # each trial's last group against the quantile of its n_cal others
        q = torch.tensor([conformal_quantile(s[t, :-1], alpha) for t in range(trials)], dtype=s.dtype)
        return float((s[:, -1] <= q).double().mean())

    return [{"alpha": alpha, "target": 1 - alpha, "coverage": coverage(alpha), "upper": 1 - alpha + 1 / (n_cal + 1)}
            for alpha in alphas]


def risk_study(seed: int = 0, n_cal: int = 512, n_fresh: int = 2000, theta_scale: float = 2.0,
               task_config: RubricToyConfig | None = None, config: SetGRPOConfig | None = None,
               group_size: int = 8) -> dict:
    """Calibrate SetGRPO once, then measure direction reversals on fresh groups from the same policy.

    Returns the calibration record and, on the fresh groups, the reversal rate among accepted and among
    rejected groups at the selected τ, the accepted share, and plain two-grader GRPO's (τ = 0) reversal rate.
    A rejected group's "reversal" is what its centre â would have done, since it applies nothing.
    """
    graded = _grader(task_config, seed, theta_scale, group_size)
    sg = SetGRPO(config or SetGRPOConfig())
    cal = sg.calibrate(*graded(n_cal), group_size=group_size)
    scores, ref, feats = graded(n_fresh)
    groups = Groups.build(scores.shape[0], None, group_size)
    gram = gram_matrices(feats, groups)
    centre, sigma, _ = joint_coefficient_set(scores, group_size=group_size, sigma_min=sg.config.sigma_min,
                                             scale=sg.config.scale)
    tau = 0.0 if math.isinf(cal.tau) else cal.tau
    rec = safe_recovery(groups.pad(centre), groups.pad(sigma), cal.q, gram, [tau, 0.0])
    rev = reversal_indicators(rec.coef, groups.pad(ref), gram)
    acc = rec.accepted[:, 0] & (not math.isinf(cal.tau))
    plain_rev = rev[:, 1] & rec.accepted[:, 1]
    rate = lambda num, den: float(num.sum()) / max(int(den.sum()), 1)  # noqa: E731
    return {"calibration": cal, "tau": cal.tau, "q": cal.q, "accepted": float(acc.double().mean()),
            "risk_accepted": rate(rev[:, 0] & acc, acc), "risk_rejected": rate(plain_rev & ~acc, ~acc),
            "risk_plain_grpo": rate(plain_rev, rec.accepted[:, 1]), "beta": sg.config.beta}


def invariance_table(transforms=((0.5, -1.0), (1.0, 0.0), (2.0, 1.0), (3.0, -2.0)), seed: int = 0,
                     theta_scale: float = 2.0, n_cal: int = 512, n_batch: int = 64,
                     task_config: RubricToyConfig | None = None, group_size: int = 8) -> list[dict]:
    """Positive-affine invariance (paper Table 7): SetGRPO on scores r and on a·r + b, same responses.

    Calibration and batch scores are both transformed. Per transform: coefficient cosine, cosine of the
    resulting updates Σ_i c_i g_i, share of groups whose accept/reject decision flips (%), and the mean
    |Δη*| over groups accepted in both (in units of 1e-3).
    """
    graded = _grader(task_config, seed, theta_scale, group_size)
    cal_scores, cal_ref, cal_feats = graded(n_cal)
    scores, _, feats = graded(n_batch)

    def run(a, b):
        sg = SetGRPO(SetGRPOConfig())
        sg.calibrate(a * cal_scores + b, cal_ref, cal_feats, group_size=group_size)
        return sg.coefficients(a * scores + b, feats, group_size=group_size)

    base = run(1.0, 0.0)
    cos = lambda x, y: float(torch.nn.functional.cosine_similarity(x, y, dim=0))  # noqa: E731
    rows = []
    for a, b in transforms:
        out = run(a, b)
        both = base.accepted & out.accepted
        d_eta = (base.eta[both] - out.eta[both]).abs().mean() if bool(both.any()) else torch.tensor(0.0)
        rows.append({"a": a, "b": b, "coef_cosine": cos(base.coef, out.coef),
                     "update_cosine": cos(feats.T @ base.coef, feats.T @ out.coef),
                     "flip_pct": 100 * float((base.accepted != out.accepted).double().mean()),
                     "d_eta_1e3": 1e3 * float(d_eta), "accepted": float(out.accepted.double().mean())})
    return rows


STAGES = ("train",)


def run_study(cfg: RubricStudyConfig, stages: Sequence[str] | None = None, *, log=print_flushed) -> StudyResult:
    """The study, one stage "train" (None: it): train the three methods over the seeds (``compare_methods``, which logs
    a line per seed and the table), on one thread, then the time it took. Returns ``compare_methods``'s rows by seed and
    their table (``StudyResult``; nothing is written to disk)."""
    chosen_stages(stages, STAGES)  # checks the names: one stage, nothing kept between calls
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = compare_methods(range(cfg.seeds), task_config=cfg.task, train_config=cfg.train, log=log)
    seconds = time.perf_counter() - t0
    log(f"({seconds:.0f} s on {torch.get_num_threads()} thread)")
    return StudyResult("rubric", None, {f"seed {row['seed']}": row for row in rows}, {"table": format_table(rows)},
                       seconds)


def _rubric_config(seeds: int = 5, **train) -> RubricStudyConfig:
    """``--set seeds=5 steps=200 reference=expert``: the seeds and any field of ``TrainConfig`` but SetGRPO's."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a whole number >= 1, got {seeds!r}")
    return RubricStudyConfig(seeds=seeds, train=TrainConfig(**train))


def _run(cfg: RubricStudyConfig, stages: Sequence[str], args) -> int:
    run_study(cfg, stages)
    return 0


#: ``python -m setpo_lab run rubric --set seeds=5 steps=200 reference=regrade``: GRPO vs SetGRPO on the rubric toy
#: (true-quality reward at the end); reference: SetGRPO's calibration reference, re-gradings by the same graders
#: ("regrade") or the expert
COMMAND = StudyCommand("rubric", {"default": _rubric_config}, STAGES, _run, default_preset="default", writes=False,
                       fields=frozenset({"seeds", *TrainConfig.__dataclass_fields__} - {"setgrpo"}),
                       doc="GRPO vs SetGRPO on the rubric toy (true-quality reward at the end).")

if __name__ == "__main__":
    raise SystemExit(run_command(COMMAND))
