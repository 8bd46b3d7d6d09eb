"""SetGRPO: calibrated grader-induced coefficients for rubric-graded GRPO (three modules).

One module a job: ``calibration`` (a), ``recovery`` (b, with the language-model gradient features),
``gating`` (c), ``method`` (the composing ``SetGRPO`` and its config); ``setpo.trl.SetGRPOTrainer`` runs it on TRL.

Source and status. SetGRPO is described in Huang et al., "SetGRPO: Calibrating Grader-Induced Policy
Optimization" (2026). Only its abstract and figure/table captions are public, and they give no formula. Every
formula in this module is therefore **this package's design**, built to do what the abstract says each module
does, on top of public methods:

- split conformal prediction (Vovk, Gammerman & Shafer 2005; Lei, G'Sell, Rinaldo, Tibshirani & Wasserman
  2018) for the joint coefficient set of module (a);
- Learn-then-Test (Angelopoulos, Bates, Candès, Jordan & Lei 2021) with fixed-sequence testing and binomial
  or Hoeffding–Bentkus p-values (Bates, Angelopoulos, Lei, Malik & Jordan 2021, "RCPS") for module (c);
- the group-relative advantage of GRPO (Shao et al. 2024), taken from ``setpo.group_advantages``.

Setting. Each response i of a group (one prompt, G responses) gets two grader scores r^A_i, r^B_i. GRPO
normalises rewards jointly within the group, so one grader's slip moves the coefficients of the whole group.

(a) Joint reward-set calibration (``joint_coefficient_set``, ``conformal_scores``, ``conformal_quantile``).
    Per-grader group advantages a^A, a^B (the "grpo" estimator of ``setpo.advantages``), centre
    â = (a^A + a^B)/2 and a per-response scale σ̂_i from the graders' disagreement |a^A_i − a^B_i|/2, floored
    by σ_min and (default, our choice) by the group's pooled disagreement. On held-out calibration groups j
    with reference coefficients a*_j (by default the group advantage of the mean of several re-gradings,
    ``reference_coefficients``; any other reference can be passed), the score is
    s_j = max_i |a*_ji − â_ji| / σ̂_ji and q̂ is the ⌈(n+1)(1−α)⌉-th smallest of n scores. The box
    C = Π_i [â_i − q̂σ̂_i, â_i + q̂σ̂_i] then holds a fresh group's a* with probability ≥ 1 − α when
    calibration and fresh groups are exchangeable (split conformal with a max-score over the group).

(b) Geometry-guided safe recovery (``safe_recovery``, ``worst_case_agreement``, ``gate_scores``).
    Per-response gradient features g_i (∇θ of the response's length-normalised log-probability; exact for
    the toy policy of ``setpo.envs.rubric``, last-layer or random-projection features for language models) give
    the group's Gram K_ij = ⟨g_i, g_j⟩, so coefficients c produce the update Σ_i c_i g_i and
    ⟨Σ a_i g_i, Σ c_i g_i⟩ = aᵀKc. For a box inflation τ ≥ 0 let C(τ) = Π_i [â_i ± τq̂σ̂_i] (τ = 1 is the
    calibrated box). The anchor c₀(τ) is the point of C(τ) nearest 0 (â soft-thresholded by τq̂σ̂), the
    path c(η) = c₀(τ) + η(â − c₀(τ)), and the worst-case agreement of the update with any coefficient vector
    in C(τ) is

        m_τ(η) = min_{a∈C(τ)} aᵀK c(η) = vᵀâ − τq̂ Σ_i σ̂_i |v_i|,   v = K c(η),

    concave in η (affine minus a sum of absolute values of affine maps). η*(τ) is the largest η ∈ [0, 1]
    with m_τ(η) ≥ 0, found by bisection from a safe breakpoint (m_τ is piecewise linear, so a non-negative
    value, if any, shows at a breakpoint). The group is *accepted at τ* when that update is not zero.

    Design choice (ours). The literal reading's score (docs/guides/setgrpo.md),
    ρ = m(η*)/(‖c(η*)‖_K ‖â‖_K), is zero whenever η* < 1 (m(η*) = 0 there), so it cannot rank partial
    recoveries, and a gate on the calibrated box alone leaves nothing for the risk test to choose. We make the
    threshold the box inflation instead: the gate score is
    ρ = the largest τ at which the group is still accepted ("how far the calibrated box can grow before no
    safe update is left"; ``gate_scores``, bisection over τ), and a group passes the gate at τ when ρ ≥ τ,
    updating with c(η*(τ)). τ = 1 reproduces the literal reading's anchor, path, m and η*; τ = 0 accepts every
    group with its centre â, i.e. plain two-grader GRPO.

(c) Selective risk-gated optimisation (``reversal_indicators``, ``ltt_select_threshold``). Rejected groups
    get zero coefficients. A *direction reversal* is an accepted group whose applied update disagrees with
    the reference update: c(η*(τ))ᵀ K a* < 0. τ is chosen from a grid by fixed-sequence testing (LTT),
    strictest first: for each τ the null "reversal rate among accepted groups > β" is tested with the
    binomial p-value P(Bin(N_τ, β) ≤ F_τ) (N_τ accepted, F_τ reversals on the risk-calibration groups;
    given N_τ the accepted groups are i.i.d., so this p-value is valid) or the Hoeffding–Bentkus one; the
    sequence stops at the first p > δ and the last τ that passed is selected. Then
    P(conditional reversal risk at τ_sel ≤ β) ≥ 1 − δ. The risk groups are disjoint from the coverage groups
    ("independent risk calibration"). Design choices: the grid is τ ∈ {3, 2.5, 2, 1.75, 1.5, 1.25, 1, 0.75,
    0.5, 0.25, 0}; the sequence starts at the strictest τ at which the *coverage* groups predict enough
    accepted risk groups to certify anything (``ltt_start_factor``; thresholds stricter than that cannot
    pass and would only end the sequence early), which keeps the order independent of the risk groups;
    when no τ passes, every group is rejected. ``SetGRPO`` recalibrates (a) and (c) every K steps as the
    policy drifts.

Positive-affine invariance: r → a·r + b with a > 0 leaves every GRPO advantage unchanged (up to the ε in
std + ε), hence â, σ̂ (σ_min is in advantage units), C, the path, ρ and η*; the tests check it.

Composition with SetPO: the accepted coefficients can take SetPO's diversity term, c_i + λ·s_i with s_i
from ``setpo.diversity_marginals`` (added on accepted groups only; a rejected group contributes nothing).

Language models. ``lm_head_gradient_features`` gives the per-response features from one no-grad forward
pass (the exact output-layer gradient of the length-normalised log-probability, or its seeded Kronecker
random projection), and ``SetGRPOTrainer`` (TRL's ``GRPOTrainer`` with two reward functions acting as the
graders; TRL is imported only when it is first accessed) calibrates on re-graded batches and replaces TRL's
advantages by SetGRPO coefficients.

Shapes: N rows (responses) in B groups, given by a verl-style ``index`` or a contiguous ``group_size``, as
everywhere in setpo; grader scores are (N, 2); gradient features (N, d); per-group outputs are (B,).
"""

from setpo.setgrpo.calibration import (
    conformal_quantile,
    conformal_scores,
    covers,
    joint_coefficient_set,
    min_calibration_size,
    reference_coefficients,
)
from setpo.setgrpo.gating import (
    binomial_p_value,
    fixed_sequence_test,
    hoeffding_bentkus_p_value,
    ltt_select_threshold,
    min_accepted_to_certify,
    reversal_indicators,
)
from setpo.setgrpo.method import (
    SetGRPO,
    SetGRPOConfig,
    SetGRPOOutput,
)
from setpo.setgrpo.recovery import (
    Recovery,
    gate_scores,
    gram_matrices,
    lm_head_gradient_features,
    safe_recovery,
    worst_case_agreement,
)

__all__ = [
    "SetGRPO",
    "SetGRPOConfig",
    "SetGRPOOutput",
    "Recovery",
    "binomial_p_value",
    "conformal_quantile",
    "conformal_scores",
    "covers",
    "fixed_sequence_test",
    "gate_scores",
    "gram_matrices",
    "hoeffding_bentkus_p_value",
    "joint_coefficient_set",
    "lm_head_gradient_features",
    "ltt_select_threshold",
    "min_accepted_to_certify",
    "min_calibration_size",
    "reference_coefficients",
    "reversal_indicators",
    "safe_recovery",
    "worst_case_agreement",
]
