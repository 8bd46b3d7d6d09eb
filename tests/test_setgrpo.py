"""SetGRPO (setpo.setgrpo) on seeded simulations: conformal coverage, LTT risk control, safe recovery by brute
force, positive-affine invariance, bad input, composition with SetPO; and the rubric toy (setpo.envs.rubric)."""

import math

import pytest
import torch

import setpo
from setpo.envs.rubric import RubricTask, RubricToyConfig
from setpo.groups import Groups
from setpo.setgrpo import (
    SetGRPO,
    SetGRPOConfig,
    binomial_p_value,
    conformal_quantile,
    conformal_scores,
    fixed_sequence_test,
    gate_scores,
    gram_matrices,
    hoeffding_bentkus_p_value,
    joint_coefficient_set,
    ltt_select_threshold,
    min_accepted_to_certify,
    min_calibration_size,
    reference_coefficients,
    reversal_indicators,
    safe_recovery,
    worst_case_agreement,
)
from setpo_lab.studies import rubric
from setpo_lab.studies.rubric import LinearSoftmaxPolicy, draw_groups

G = 8


@pytest.fixture(autouse=True)
def one_thread():
    """These are many small tensor ops: one thread is faster than two fighting over shared CI cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def draw(task, policy, n_groups, gen, regrades=2):
    """Graded groups from the toy: scores (N, 2), reference a* (N,), exact gradient features (N, d)."""
    p, r = draw_groups(task, policy, n_groups, G, gen)
    scores = task.grade(p, r, gen)
    ref = reference_coefficients(task.regrade(p, r, regrades, gen), group_size=G)
    return scores, ref, policy.grad_features(p, r)


NOISY = RubricToyConfig(grader_noise=(0.15, 0.15), slip_prob=(0.1, 0.1))


def partly_trained(task, scale=2.0):
    """A policy part-way to the optimum: its groups hold few distinct responses, close in quality."""
    policy = LinearSoftmaxPolicy(task)
    with torch.no_grad():
        policy.theta.copy_(scale * task.w_true)
    return policy


def binomial_slack(p, n, z=3.0):
    return z * math.sqrt(p * (1 - p) / n)


# ------------------------------------------------------------------------------------------------ coverage


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_joint_box_covers_reference_at_1_minus_alpha(alpha):
    """Over many independent calibrations, a fresh group's a* falls in its box at rate >= 1 − α (up to a
    binomial tolerance), and not much above 1 − α + 1/(n+1) (split conformal is tight for continuous scores)."""
    task = RubricTask(RubricToyConfig(grader_noise=(0.1, 0.1), slip_prob=(0.05, 0.05)), seed=0)
    policy = LinearSoftmaxPolicy(task)
    gen = torch.Generator().manual_seed(1)
    trials, n_cal = 400, 39
    scores, ref, _ = draw(task, policy, trials * (n_cal + 1), gen)
    centre, sigma, _ = joint_coefficient_set(scores, group_size=G)
    s = conformal_scores(ref, centre, sigma, group_size=G).reshape(trials, n_cal + 1)
    covered = torch.tensor([bool(s[t, -1] <= conformal_quantile(s[t, :-1], alpha)) for t in range(trials)])
    rate = covered.double().mean().item()
    assert rate >= 1 - alpha - binomial_slack(alpha, trials)
    assert rate <= 1 - alpha + 1 / (n_cal + 1) + binomial_slack(alpha, trials)


def test_conformal_quantile_is_the_right_order_statistic():
    scores = torch.arange(1, 20, dtype=torch.float64)  # 19 scores
    assert conformal_quantile(scores, 0.1) == 18.0     # ceil(20 * 0.9) = 18
    assert conformal_quantile(scores.flip(0), 0.5) == 10.0
    assert min_calibration_size(0.1) == 9 and min_calibration_size(0.2) == 4 and min_calibration_size(0.05) == 19


# ------------------------------------------------------------------------------------------ risk control


def test_fixed_sequence_stops_at_first_failure():
    assert fixed_sequence_test([0.01, 0.02, 0.5, 0.001], delta=0.1) == 2
    assert fixed_sequence_test([0.2, 0.0, 0.0], delta=0.1) == 0
    assert fixed_sequence_test([0.0, 0.05], delta=0.1) == 2


def test_ltt_selects_last_pass_before_first_failure():
    n = 200
    grid = [2.0, 1.0, 0.5, 0.0]
    acc = torch.ones(n, 4, dtype=torch.bool)
    rev = torch.zeros(n, 4, dtype=torch.bool)
    rev[:40, 1] = True          # τ = 1.0: 20% reversals, fails
    rev[:2, 2] = True           # τ = 0.5: 1% reversals, would pass, but the sequence has stopped
    sel = ltt_select_threshold(acc, rev, grid, beta=0.08, delta=0.1)
    assert sel.tau == 2.0 and sel.index == 0 and sel.tested == [0, 1]
    assert math.isnan(sel.p_values[2])
    # starting past the failure, the sequence reaches 0.5 and then 0.0 (no reversals there)
    sel = ltt_select_threshold(acc, rev, grid, beta=0.08, delta=0.1, start=2)
    assert sel.tau == 0.0 and sel.tested == [2, 3]
    # a first failure selects nothing: every group is rejected
    rev[:, 0] = True
    assert math.isinf(ltt_select_threshold(acc, rev, grid).tau)


def test_p_values():
    # exact binomial tail against a direct sum
    n, f, beta = 50, 2, 0.08
    direct = sum(math.comb(n, i) * beta**i * (1 - beta) ** (n - i) for i in range(f + 1))
    assert binomial_p_value(f, n, beta) == pytest.approx(direct, rel=1e-12)
    assert binomial_p_value(0, 0, beta) == 1.0
    k = min_accepted_to_certify(0.08, 0.1)
    assert binomial_p_value(0, k, 0.08) <= 0.1 < binomial_p_value(0, k - 1, 0.08)
    # Hoeffding–Bentkus: a valid p-value is never far below the exact one, and grows with failures
    hb = [hoeffding_bentkus_p_value(f, 200, 0.08) for f in range(0, 30, 3)]
    assert all(a <= b for a, b in zip(hb, hb[1:], strict=False))
    assert all(hoeffding_bentkus_p_value(f, 200, 0.08) >= binomial_p_value(f, 200, 0.08) for f in range(0, 30, 3))


def test_conditional_reversal_risk_is_controlled_on_fresh_groups():
    """Calibrate τ by LTT, then measure the reversal rate among accepted fresh groups: it is <= β in at least
    1 − δ of repetitions (tolerance: sampling error of the fresh estimate and of the repetition count).
    The world is noisy enough that plain two-grader GRPO (τ = 0) reverses more than β, so the gate matters."""
    cfg = SetGRPOConfig(beta=0.08, delta=0.1)
    task = RubricTask(NOISY, seed=3)
    policy = partly_trained(task)
    gen = torch.Generator().manual_seed(4)
    reps, n_cal, n_fresh = 40, 512, 1500
    fresh_scores, fresh_ref, fresh_feat = draw(task, policy, n_fresh, gen)
    groups = Groups.build(n_fresh * G, None, G)
    gram = gram_matrices(fresh_feat, groups)
    centre, sigma, _ = joint_coefficient_set(fresh_scores, group_size=G, sigma_min=cfg.sigma_min)
    ref_p = groups.pad(fresh_ref)
    ok, selected = 0, []
    for _ in range(reps):
        sg = SetGRPO(cfg)
        cal = sg.calibrate(*draw(task, policy, n_cal, gen), group_size=G)
        taus = [0.0] if math.isinf(cal.tau) else [cal.tau, 0.0]
        rec = safe_recovery(groups.pad(centre), groups.pad(sigma), cal.q, gram, taus)
        rev = reversal_indicators(rec.coef, ref_p, gram)
        acc = rec.accepted
        plain_risk = (rev[:, -1] & acc[:, -1]).sum().item() / acc[:, -1].sum().item()
        assert plain_risk > cfg.beta  # the premise: without the gate the risk is above β
        if math.isinf(cal.tau):
            ok += 1  # nothing accepted: no accepted group can reverse
            continue
        selected.append(cal.tau)
        n_acc = acc[:, 0].sum().item()
        risk = (rev[:, 0] & acc[:, 0]).sum().item() / n_acc
        ok += risk <= cfg.beta + binomial_slack(cfg.beta, n_acc, z=2.0)
    assert ok / reps >= 1 - cfg.delta - binomial_slack(cfg.delta, reps, z=2.0)
    assert len(selected) >= reps // 2 and min(selected) > 0.0  # it does accept, and never falls back to GRPO


# ------------------------------------------------------------------------------------------------ recovery


def random_groups(b, g, d, seed):
    gen = torch.Generator().manual_seed(seed)
    centre = torch.randn(b, g, generator=gen, dtype=torch.float64)
    sigma = 0.05 + torch.rand(b, g, generator=gen, dtype=torch.float64)
    feats = torch.randn(b, g, d, generator=gen, dtype=torch.float64)
    return centre, sigma, feats @ feats.transpose(-1, -2)


@pytest.mark.parametrize("d", [3, 16])  # rank-deficient and full-rank Gram matrices
@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 2.0])
def test_eta_star_is_the_largest_safe_ratio_on_a_grid(d, tau):
    centre, sigma, gram = random_groups(300, 6, d, seed=d)
    q = 0.8
    rec = safe_recovery(centre, sigma, q, gram, tau)
    eta, m_eta = rec.eta[:, 0], rec.m_at_eta[:, 0]
    grid = torch.linspace(0, 1, 4001, dtype=torch.float64)
    m = torch.stack([worst_case_agreement(grid, centre[i], sigma[i], q, gram[i], tau) for i in range(300)])
    safe = m >= 0
    last_safe = torch.where(safe, grid, torch.full_like(m, -1.0)).amax(-1)
    feasible = torch.isfinite(eta)
    assert torch.equal(feasible, safe.any(-1))
    assert bool((eta[feasible] >= last_safe[feasible]).all())                      # no safe grid point beyond η*
    assert bool((eta[feasible] < last_safe[feasible] + 1 / 4000 + 1e-12).all())    # and η* is within a step
    assert bool((m_eta[feasible] >= 0).all())                                       # m(η*) ≥ 0
    second = m[:, 2:] - 2 * m[:, 1:-1] + m[:, :-2]
    assert float(second.max()) <= 1e-9 * float(m.abs().max())                      # m concave in η
    assert 0 < feasible.double().mean() < 1 or tau == 0.0                          # both cases occur


def test_recovery_endpoints_and_gate_scores():
    centre, sigma, gram = random_groups(400, 8, 5, seed=7)
    q = 1.1
    taus = torch.tensor([0.0, 0.25, 0.5, 1.0, 1.5, 3.0], dtype=torch.float64)
    rec = safe_recovery(centre, sigma, q, gram, taus, with_rho=True)
    # τ = 1: the literal reading's anchor (docs/guides/setgrpo.md), the calibrated box's point nearest 0
    # (soft-threshold of â by q̂σ̂)
    soft = centre.sign() * (centre.abs() - q * sigma).clamp_min(0)
    torch.testing.assert_close(rec.anchor[:, 3], soft)
    # τ = 0: every group keeps its centre â (plain two-grader GRPO)
    assert bool(rec.accepted[:, 0].all()) and bool((rec.eta[:, 0] == 1).all())
    torch.testing.assert_close(rec.coef[:, 0], centre)
    # acceptance is nested in τ, and ρ ≥ τ exactly where the group is accepted (up to bisection tolerance)
    acc = rec.accepted
    assert not bool((acc[:, 1:] & ~acc[:, :-1]).any())
    near = (rec.rho[:, None] - taus[None]).abs() < 1e-6
    assert bool(((rec.rho[:, None] >= taus[None]) == acc)[~near].all())
    # every accepted update agrees with every coefficient vector of its box: worst case m_τ(η*) ≥ 0
    assert bool((rec.m_at_eta[acc] >= 0).all())
    # rejected groups contribute nothing
    assert bool((rec.coef[~acc] == 0).all())
    # partial recoveries happen (0 < η* < 1) somewhere in the grid
    assert bool(((rec.eta > 0) & (rec.eta < 1)).any())


def test_gate_scores_match_direct_acceptance_with_identity_geometry():
    centre, sigma, _ = random_groups(200, 5, 5, seed=11)
    eye = torch.eye(5, dtype=torch.float64).expand(200, 5, 5)
    rho = gate_scores(centre, sigma, 1.0, eye)
    for tau in (0.3, 0.9, 1.7):
        acc = safe_recovery(centre, sigma, 1.0, eye, tau).accepted[:, 0]
        far = (rho - tau).abs() > 1e-6
        assert torch.equal((rho >= tau)[far], acc[far])


# -------------------------------------------------------------------------------------- the estimator


def calibrated(seed=0, **cfg):
    """A SetGRPO calibrated where the gate is active (τ > 0), and a fresh batch to apply it to."""
    task = RubricTask(NOISY, seed=seed)
    policy = partly_trained(task)
    gen = torch.Generator().manual_seed(seed + 100)
    sg = SetGRPO(SetGRPOConfig(**cfg))
    sg.calibrate(*draw(task, policy, 512, gen), group_size=G)
    return sg, draw(task, policy, 64, gen)


@pytest.mark.parametrize("a,b", [(0.5, -1.0), (1.0, 0.0), (2.0, 1.0), (3.0, -2.0)])
def test_positive_affine_invariance(a, b):
    """Paper Table 7: coefficients from r and a·r + b (a > 0) agree; so do q̂, τ, decisions and η*."""
    task = RubricTask(NOISY, seed=0)
    policy = partly_trained(task)
    gen = torch.Generator().manual_seed(1)
    cal_scores, cal_ref, cal_feat = draw(task, policy, 512, gen)
    scores, _, feats = draw(task, policy, 64, gen)
    outs = []
    for t in (lambda r: r, lambda r: a * r + b):
        sg = SetGRPO(SetGRPOConfig())
        sg.calibrate(t(cal_scores), cal_ref, cal_feat, group_size=G)
        outs.append((sg.calibration, sg.coefficients(t(scores), feats, group_size=G)))
    (c0, o0), (c1, o1) = outs
    assert c1.q == pytest.approx(c0.q, rel=1e-4) and c1.tau == c0.tau
    assert torch.nn.functional.cosine_similarity(o0.coef, o1.coef, dim=0) >= 0.999
    assert torch.equal(o0.accepted, o1.accepted)
    ok = o0.accepted
    assert float((o0.eta[ok] - o1.eta[ok]).abs().max()) < 1e-3
    assert bool(ok.any()) and not bool(ok.all()) and c0.tau > 0  # the gate was active


def test_ragged_index_matches_contiguous_groups():
    sg, (scores, _, feats) = calibrated()
    base = sg.coefficients(scores, feats, group_size=G)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(scores.shape[0], generator=gen)
    index = (torch.arange(scores.shape[0]) // G)[perm].tolist()
    shuffled = sg.coefficients(scores[perm], feats[perm], index)
    torch.testing.assert_close(shuffled.coef, base.coef[perm])
    # unequal sizes: drop one response from the first group (row order kept)
    keep = torch.arange(1, scores.shape[0])
    ragged = sg.coefficients(scores[keep], feats[keep], (torch.arange(scores.shape[0]) // G)[keep].tolist())
    torch.testing.assert_close(ragged.coef[G - 1:], base.coef[G:])


def test_setpo_composition_adds_diversity_on_accepted_groups_only():
    sg, (scores, _, feats) = calibrated()
    emb = torch.randn(scores.shape[0], 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain = sg.coefficients(scores, feats, group_size=G)
    sg.config.lam = 0.1
    mixed = sg.coefficients(scores, feats, group_size=G, emb=emb)
    s = setpo.diversity_marginals(emb, group_size=G)
    assert torch.equal(mixed.coef, plain.coef + 0.1 * s * plain.row_accepted)  # Â = Ā + λ·s on accepted groups
    assert bool(plain.accepted.any()) and not bool(plain.accepted.all())
    with pytest.raises(ValueError, match="embeddings"):
        sg.coefficients(scores, feats, group_size=G)


def test_recalibration_schedule():
    sg = SetGRPO(SetGRPOConfig(recalibrate_every=5))
    assert sg.needs_calibration(0)
    task = RubricTask(RubricToyConfig(), seed=0)
    gen = torch.Generator().manual_seed(0)
    sg.calibrate(*draw(task, LinearSoftmaxPolicy(task), 64, gen), group_size=G, step=3)
    assert [sg.needs_calibration(s) for s in (4, 7, 8)] == [False, False, True]


# --------------------------------------------------------------------------------------------- bad input


def test_bad_input_says_what_is_needed():
    sg, (scores, ref, feats) = calibrated()
    missing = scores.clone()
    missing[5, 1] = float("nan")
    with pytest.raises(ValueError, match=r"missing .*response 5, grader B.*both graders"):
        sg.coefficients(missing, feats, group_size=G)
    with pytest.raises(ValueError, match=r"two grader scores per response, shape \(N, 2\)"):
        sg.coefficients(scores[:, 0], feats, group_size=G)
    with pytest.raises(ValueError, match="at least 2 responses per group"):
        joint_coefficient_set(scores[:9], [0] * 8 + [1])
    with pytest.raises(ValueError, match="at least 2 responses per group"):
        sg.coefficients(scores, feats, group_size=1)
    with pytest.raises(ValueError, match=r"too small for alpha=0.1.*need at least 9"):
        conformal_quantile(torch.rand(8), 0.1)
    with pytest.raises(ValueError, match=r"calibration set too small.*at least 9 coverage groups"):
        SetGRPO(SetGRPOConfig(alpha=0.1)).calibrate(scores[: 10 * G], ref[: 10 * G], feats[: 10 * G],
                                                    group_size=G)
    with pytest.raises(ValueError, match="not calibrated"):
        SetGRPO().coefficients(scores, feats, group_size=G)
    with pytest.raises(ValueError, match="features"):
        sg.coefficients(scores, feats[:-1], group_size=G)
    bad = feats.clone()
    bad[3, 0] = float("inf")
    with pytest.raises(ValueError, match="features contains NaN or infinite"):
        sg.coefficients(scores, bad, group_size=G)
    with pytest.raises(ValueError, match="tau must be"):
        safe_recovery(torch.zeros(1, 3), torch.ones(1, 3), 1.0, torch.eye(3)[None], -0.5)
    with pytest.raises(ValueError, match="descending"):
        SetGRPOConfig(tau_grid=(0.0, 1.0))
    with pytest.raises(ValueError, match="regrades contain missing"):
        reference_coefficients(torch.tensor([[0.1, float("nan")], [0.2, 0.3]]))


# ------------------------------------------------------------------------------------------------ the toy


def test_toy_gradient_features_are_exact():
    task = RubricTask(RubricToyConfig(), seed=2)
    policy = LinearSoftmaxPolicy(task)
    with torch.no_grad():
        policy.theta.copy_(torch.randn(task.config.feature_dim, generator=torch.Generator().manual_seed(0),
                                       dtype=torch.float64))
    prompts, responses = torch.tensor([0, 0, 3, 7]), torch.tensor([1, 5, 2, 15])
    feats = policy.grad_features(prompts, responses)
    for i in range(4):
        policy.theta.grad = None
        policy.log_probs(prompts[i:i + 1])[0, responses[i]].backward()
        torch.testing.assert_close(feats[i], policy.theta.grad)


def test_toy_graders_and_regrading():
    task = RubricTask(RubricToyConfig(slip_prob=(0.0, 0.0), grader_noise=(0.0, 0.0)), seed=0)
    gen = torch.Generator().manual_seed(0)
    p, r = torch.arange(64), torch.zeros(64, dtype=torch.long)
    s = task.grade(p, r, gen)
    clear = ~task.ambiguous
    # noiseless graders agree with the latent quality on clear prompts and disagree (taste) on ambiguous ones
    torch.testing.assert_close(s[clear, 0], task.quality[p, r][clear].clamp(0, 1))
    assert float((s[~clear, 0] - s[~clear, 1]).abs().mean()) > 0.1
    assert task.regrade(p, r, 3, gen).shape == (3, 64, 2)
    with pytest.raises(ValueError, match="positive integer"):
        task.regrade(p, r, 0, gen)


def test_toy_setgrpo_ends_above_grpo():
    """The rubric study's claim in small (docs/studies/rubric.md): three seeds of the default toy run
    (``setpo_lab.studies.rubric.compare_methods`` runs five)."""
    gains = []
    for seed in range(3):
        grpo, sg = (rubric._train_method(m, seed=seed) for m in ("grpo", "setgrpo"))
        gains.append(sg["final_true_quality"] - grpo["final_true_quality"])
        assert 0 < sum(sg["accepted_ratio"]) / len(sg["accepted_ratio"]) < 1
    assert sum(gains) / len(gains) > 0.01 and sum(g > 0 for g in gains) >= 2


# ------------------------------------------------------------------------------------------ LM features, TRL


def test_lm_head_gradient_features_exact_and_projected():
    gen = torch.Generator().manual_seed(0)
    n, t, h, v, temp = 5, 7, 6, 11, 0.7
    hidden = torch.randn(n, t, h, generator=gen)
    weight = torch.randn(v, h, generator=gen, requires_grad=True)
    tokens = torch.randint(v, (n, t), generator=gen)
    mask = (torch.rand(n, t, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    logits = hidden @ weight.T
    exact = setpo.setgrpo.lm_head_gradient_features(hidden, logits.detach(), tokens, mask, dims=None,
                                                    temperature=temp)
    for i in range(n):  # autograd of the length-normalised log-probability w.r.t. the output layer
        weight.grad = None
        logp = torch.log_softmax(logits[i] / temp, -1).gather(1, tokens[i][:, None])[:, 0]
        ((logp * mask[i]).sum() / mask[i].sum()).backward(retain_graph=True)
        torch.testing.assert_close(exact[i], weight.grad.reshape(-1), atol=1e-5, rtol=1e-4)
    gram = exact @ exact.T
    est = torch.stack([f @ f.T for f in (
        setpo.setgrpo.lm_head_gradient_features(hidden, logits.detach(), tokens, mask, dims=(8, 8), seed=s,
                                                temperature=temp) for s in range(300))]).mean(0)
    assert float((est - gram).abs().max()) < 0.15 * float(gram.abs().max())  # unbiased: the mean converges
    with pytest.raises(ValueError, match="at least one real token"):
        setpo.setgrpo.lm_head_gradient_features(hidden, logits, tokens, torch.zeros(n, t))


def test_trl_trainer_two_reward_functions_as_graders(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig

    from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer
    from setpo.trl import SetGRPOTrainer

    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)
    prompts = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]
    g = 4

    def grader_a(completions, **_):
        return [float(len(c) % 5) for c in completions]

    def grader_b(completions, **_):
        return [float(len(c) % 5) + 0.5 * (c.count("1") % 2) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=g, per_device_train_batch_size=len(prompts) * g,
                      max_completion_length=8, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                      temperature=1.0, beta=0.0, seed=0, disable_tqdm=True)
    # a loose risk target, so that the few calibration groups of a unit test can certify a threshold
    cfg = SetGRPOConfig(alpha=0.2, beta=0.5, delta=0.5, risk_fraction=0.5, recalibrate_every=100)
    trainer = SetGRPOTrainer(model=model, reward_funcs=[grader_a, grader_b], args=args, processing_class=tok,
                             train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                             setgrpo=cfg, calibration_groups=8, n_regrades=1, feature_dims=(4, 4))
    trainer.model.train()
    batch = [{"prompt": p} for p in prompts for _ in range(g)]
    outs = []
    for seed in range(4):
        torch.manual_seed(seed)
        outs.append(trainer._generate_and_score_completions(batch))
    calibrated = trainer._metrics["train"]["setgrpo/calibrated"]
    assert calibrated == [0.0, 0.0, 1.0, 1.0]  # 3 groups per batch: the third batch completes 8 groups
    assert trainer.setgrpo.calibration is not None and trainer._store == []
    last = trainer.last_setgrpo
    torch.testing.assert_close(outs[-1]["advantages"], last.coef.to(outs[-1]["advantages"]))
    # the policy's own output layer: Qwen2's last hidden state times lm_head gives its logits, so the
    # features are the gradients of its log-probabilities
    ids = torch.cat([outs[-1]["prompt_ids"], outs[-1]["completion_ids"]], 1)
    with torch.no_grad():
        out = trainer.model(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(out.hidden_states[-1] @ trainer.model.lm_head.weight.T, out.logits,
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="exactly two reward functions"):
        SetGRPOTrainer(model=model, reward_funcs=[grader_a], args=args, processing_class=tok,
                       train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    # SetGRPO's own arguments are refused by name before TRL builds anything (never mid-training)
    for kwargs, match in ((dict(n_regrades=1.5), "n_regrades"), (dict(calibration_groups=1), "calibration_groups"),
                          (dict(feature_dims=(0, 4)), "feature_dims\\[0\\]"), (dict(feature_dims="44"), "feature_dims"),
                          (dict(feature_seed=-1), "feature_seed"), (dict(setgrpo={"lam": 0.1}), "SetGRPOConfig"),
                          (dict(embedder="minilm", setgrpo=SetGRPOConfig(lam=0.1)), "embedder must be callable"),
                          (dict(setgrpo=SetGRPOConfig(lam=0.1)), "needs an embedder")):
        with pytest.raises(ValueError, match=match):
            SetGRPOTrainer(model=model, reward_funcs=[grader_a, grader_b], args=args, processing_class=tok,
                           train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), **kwargs)
