"""``SetGRPO``: the three modules composed into one estimator with its config, and recalibration over training.

See ``setpo.setgrpo`` for the method and which parts are this package's design."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch

from setpo.advantages import check_estimator, setpo_advantages
from setpo.groups import check_int, check_real
from setpo.setgrpo.calibration import (
    SCALES,
    conformal_quantile,
    conformal_scores,
    joint_coefficient_set,
    min_calibration_size,
)
from setpo.setgrpo.gating import (
    P_VALUES,
    ThresholdSelection,
    ltt_select_threshold,
    min_accepted_to_certify,
    reversal_indicators,
)
from setpo.setgrpo.inputs import (
    check_bisect,
    check_level,
    feature_rows,
    float_rows,
    grader_scores,
    response_groups,
)
from setpo.setgrpo.recovery import gate_scores, gram_matrices, safe_recovery

DEFAULT_TAU_GRID = (3.0, 2.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.25, 0.0)


@dataclass
class SetGRPOConfig:
    """Every SetGRPO knob in one place.

    alpha: miscoverage of the joint coefficient box (module a).
    beta: target conditional direction-reversal risk among accepted groups (module c); 0.08 as in the
        paper's figures.
    delta: probability that the selected threshold misses that target (LTT error level).
    sigma_min: floor of the per-response box scale σ̂, in advantage (z-score) units.
    scale: "pooled" (default) or "response", how σ̂ is formed (see ``joint_coefficient_set``).
    tau_grid: candidate thresholds for the gate ρ ≥ τ (box inflations), strictest first, each ≥ 0; 1 is the
        calibrated box and 0 accepts every group with its centre â (plain two-grader GRPO).
    p_value: "binomial" (exact) or "hoeffding_bentkus".
    risk_fraction: share of the calibration groups kept apart for the risk calibration (c); the rest
        calibrates the box (a).
    ltt_start_factor: the fixed sequence starts at the strictest threshold at which the coverage groups
        predict at least this many times ⌈log δ / log(1−β)⌉ accepted risk groups (the fewest that could
        certify anything). Stricter thresholds accept too few groups to pass, and one reversal among a few
        dozen would end the sequence before it reaches thresholds that can pass.
    recalibrate_every: K, steps between recalibrations as the policy drifts.
    estimator, eps: the per-grader group estimator (a name in setpo.ADVANTAGE_ESTIMATORS) and its ε.
    lam: SetPO diversity weight λ; 0 turns the diversity term off.
    n_bisect: bisection steps for η* (30 halvings: η* to 1e-9).
    identity_geometry: ignore gradient features and use K = I (the paper's "identity geometry" ablation).
    """

    alpha: float = 0.1
    beta: float = 0.08
    delta: float = 0.1
    sigma_min: float = 0.25
    scale: str = "pooled"
    tau_grid: tuple[float, ...] = DEFAULT_TAU_GRID
    p_value: str = "binomial"
    risk_fraction: float = 0.75
    ltt_start_factor: float = 2.0
    recalibrate_every: int = 10
    estimator: str = "grpo"
    eps: float = 1e-6
    lam: float = 0.0
    n_bisect: int = 30
    identity_geometry: bool = False

    def __post_init__(self):
        # checked, not converted: the values stay as given (a record of the config shows what was passed)
        for name in ("alpha", "beta", "delta", "risk_fraction"):
            check_level(getattr(self, name), name)
        check_real(self.sigma_min, "sigma_min", minimum=0.0, strict=True)
        check_real(self.ltt_start_factor, "ltt_start_factor", minimum=0.0, strict=True)
        check_real(self.eps, "eps", minimum=0.0, strict=True)
        check_real(self.lam, "lam", minimum=0.0)  # λ < 0 would reward sameness
        check_bisect(self.n_bisect)
        check_int(self.recalibrate_every, "recalibrate_every", minimum=1)
        check_estimator(self.estimator)
        if not isinstance(self.identity_geometry, bool):
            raise ValueError(f"identity_geometry must be True or False, got {self.identity_geometry!r:.40}")
        if not isinstance(self.scale, str) or self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r:.40}")
        if isinstance(self.tau_grid, (str, bytes)) or not isinstance(self.tau_grid, (tuple, list)) \
                or not self.tau_grid:
            raise ValueError(f"tau_grid must be a non-empty sequence of finite values >= 0, got "
                             f"{self.tau_grid!r:.80}")
        for k, t in enumerate(self.tau_grid):
            check_real(t, f"tau_grid[{k}]", minimum=0.0)
        if any(b > a for a, b in zip(self.tau_grid, self.tau_grid[1:])):
            raise ValueError("tau_grid must be ordered strictest first (descending)")
        if not isinstance(self.p_value, str) or self.p_value not in P_VALUES:
            raise ValueError(f"p_value must be one of {sorted(P_VALUES)}, got {self.p_value!r:.40}")
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, name, value):
        # a knob set after construction (``sg.config.lam = 0.1``) is checked as at construction: SetGRPO reads its
        # config on every call
        if self.__dict__.get("_checked") and name in {f.name for f in fields(self)}:
            replace(self, **{name: value})  # raises the constructor's ValueError, naming the field
        object.__setattr__(self, name, value)


@dataclass
class SetGRPOOutput:
    """Coefficients of one batch and what decided them.

    coef: (N,) training coefficients (zero on rejected groups; + λ·s_i on accepted ones when λ > 0).
    accepted: (B,) bool per group; row_accepted: (N,) the same per response.
    eta: (B,) recovery ratio η* at the selected τ (NaN where infeasible); rho: (B,) gate scores or None.
    centre, sigma: (N,) â and σ̂; per_grader: (N, 2) a^A and a^B.
    """

    coef: torch.Tensor
    accepted: torch.Tensor
    row_accepted: torch.Tensor
    eta: torch.Tensor
    rho: torch.Tensor | None
    centre: torch.Tensor
    sigma: torch.Tensor
    per_grader: torch.Tensor
    tau: float
    q: float

    @property
    def accepted_ratio(self) -> float:
        return float(self.accepted.double().mean())

    @property
    def mean_recovery_ratio(self) -> float:
        """Mean η* over accepted groups (NaN when none is accepted)."""
        return float(self.eta[self.accepted].mean()) if bool(self.accepted.any()) else math.nan

    @property
    def coef_norm(self) -> float:
        """RMS of the coefficients over all responses (the paper's coefficient norm, Figure 5, in miniature)."""
        return float(self.coef.double().pow(2).mean().sqrt())


@dataclass
class Calibration:
    """Frozen calibration record (the paper's Table 4 in miniature)."""

    q: float
    tau: float
    n_coverage: int
    n_risk: int
    selection: ThresholdSelection
    coverage_scores: torch.Tensor = field(repr=False)


class SetGRPO:
    """SetGRPO coefficients: calibrate on re-graded groups, then gate and recover each training batch.

    Typical loop::

        sg = SetGRPO(SetGRPOConfig())
        for step in range(steps):
            if sg.needs_calibration(step):
                sg.calibrate(cal_scores, cal_reference, cal_features, group_size=G)
            out = sg.coefficients(scores, features, group_size=G)   # out.coef replaces GRPO's advantages
    """

    def __init__(self, config: SetGRPOConfig | None = None):
        if config is not None and not isinstance(config, SetGRPOConfig):
            raise ValueError(f"config must be a SetGRPOConfig, got {type(config).__name__}")
        self.config = config or SetGRPOConfig()
        self.calibration: Calibration | None = None
        self._calibrated_at: int | None = None

    def needs_calibration(self, step: int) -> bool:
        return self._calibrated_at is None or step - self._calibrated_at >= self.config.recalibrate_every

    def calibrate(self, scores, reference, features=None, index=None, *, group_size: int | None = None,
                  step: int = 0) -> Calibration:
        """Fit q̂ (a) on one part of the calibration groups and τ (c) on the other, disjoint, part.

        scores: (N, 2) grader scores of calibration responses; reference: (N,) reference coefficients a*
        (e.g. ``reference_coefficients`` of re-gradings); features: (N, d) gradient features or None.
        Groups are split in order of first appearance: the first (1 − risk_fraction) share for coverage.
        """
        cfg = self.config
        s = grader_scores(scores)
        n = s.shape[0]
        groups = response_groups(n, index, group_size, s.device)
        ref = float_rows(reference, "reference", n, s.device)
        feats = None if cfg.identity_geometry else feature_rows(features, n, s.device)
        n_groups = groups.num_groups
        n_risk = int(round(n_groups * cfg.risk_fraction))
        n_cov = n_groups - n_risk
        if n_cov < min_calibration_size(cfg.alpha) or n_risk < 1:
            raise ValueError(
                f"calibration set too small: {n_groups} groups split into {n_cov} for coverage and {n_risk} "
                f"for risk; alpha={cfg.alpha} needs at least {min_calibration_size(cfg.alpha)} coverage groups, "
                f"so pass at least {math.ceil(min_calibration_size(cfg.alpha) / (1 - cfg.risk_fraction))} "
                f"calibration groups"
            )
        centre, sigma, _ = joint_coefficient_set(s, index, group_size=group_size, sigma_min=cfg.sigma_min,
                                                 scale=cfg.scale, estimator=cfg.estimator, eps=cfg.eps)
        valid = groups.valid()
        cen_p, ref_p = groups.pad(centre), groups.pad(ref)
        cov_scores = conformal_scores(ref, centre, sigma, index, group_size=group_size)[:n_cov]
        q = conformal_quantile(cov_scores, cfg.alpha)
        gram = gram_matrices(feats, groups)
        sig_p = groups.pad(sigma, fill=1.0)
        tau_grid = torch.tensor(cfg.tau_grid, dtype=torch.float64, device=s.device)
        # Where to start the fixed sequence: thresholds at which too few groups would be accepted to certify
        # anything cannot pass and would only end the sequence early. Judge that on the coverage groups,
        # which are independent of the risk groups, so the test order stays fixed in advance.
        cov_acc = safe_recovery(cen_p[:n_cov], sig_p[:n_cov], q, gram[:n_cov], tau_grid, n_bisect=0,
                                valid=None if valid is None else valid[:n_cov]).accepted
        expected = cov_acc.double().mean(0) * n_risk
        enough = (expected >= cfg.ltt_start_factor * min_accepted_to_certify(cfg.beta, cfg.delta)).nonzero()
        start = int(enough[0]) if len(enough) else len(cfg.tau_grid) - 1
        risk = slice(n_cov, n_groups)
        rec = safe_recovery(cen_p[risk], sig_p[risk], q, gram[risk], tau_grid,
                            n_bisect=cfg.n_bisect, valid=None if valid is None else valid[risk])
        rev = reversal_indicators(rec.coef, ref_p[risk], gram[risk])
        sel = ltt_select_threshold(rec.accepted, rev, cfg.tau_grid, beta=cfg.beta, delta=cfg.delta,
                                   p_value=cfg.p_value, start=start)
        self.calibration = Calibration(q, sel.tau, n_cov, n_risk, sel, cov_scores)
        self._calibrated_at = step
        return self.calibration

    def coefficients(self, scores, features=None, index=None, *, group_size: int | None = None,
                     emb=None, with_rho: bool = False) -> SetGRPOOutput:
        """SetGRPO coefficients of one training batch (needs ``calibrate`` first).

        scores: (N, 2); features: (N, d) per-response gradient features (None only with identity geometry);
        emb: (N, e) response embeddings for SetPO's diversity term when config.lam > 0;
        with_rho: also report the gate scores ρ (a diagnostic: acceptance is decided at τ directly).
        """
        if self.calibration is None:
            raise ValueError("SetGRPO is not calibrated: call calibrate(...) on re-graded groups first")
        cfg, cal = self.config, self.calibration
        s = grader_scores(scores)
        n = s.shape[0]
        groups = response_groups(n, index, group_size, s.device)
        if features is None and not cfg.identity_geometry:
            raise ValueError("features (N, d) of per-response gradients are needed (or set identity_geometry)")
        feats = None if cfg.identity_geometry else feature_rows(features, n, s.device)
        centre, sigma, per = joint_coefficient_set(s, index, group_size=group_size, sigma_min=cfg.sigma_min,
                                                   scale=cfg.scale, estimator=cfg.estimator, eps=cfg.eps)
        valid = groups.valid()
        gram = gram_matrices(feats, groups)
        cen_p, sig_p = groups.pad(centre), groups.pad(sigma, fill=1.0)
        rho = gate_scores(cen_p, sig_p, cal.q, gram) if with_rho else None
        if math.isinf(cal.tau):  # no threshold passed the risk test: every group is rejected
            b = groups.num_groups
            rec_eta = torch.full((b,), math.nan, dtype=torch.float64, device=s.device)
            accepted = torch.zeros(b, dtype=torch.bool, device=s.device)
            coef = torch.zeros(n, dtype=torch.float64, device=s.device)
        else:
            rec = safe_recovery(cen_p, sig_p, cal.q, gram, cal.tau, n_bisect=cfg.n_bisect, valid=valid)
            accepted, rec_eta = rec.accepted[:, 0], rec.eta[:, 0]
            coef = groups.unpad(rec.coef[:, 0, :])
        row_acc = accepted[groups.group_id]
        if cfg.lam > 0:
            if emb is None:
                raise ValueError("config.lam > 0 needs response embeddings emb (N, e) for SetPO's diversity term")
            # Â = coefficient + λ·s; rejected groups get no term either
            coef = setpo_advantages(None, emb, index, group_size=group_size, base=coef, lam=cfg.lam,
                                    without_term=~row_acc)
        return SetGRPOOutput(coef, accepted, row_acc, rec_eta, rho, centre, sigma, per, cal.tau, cal.q)
