"""Hostile inputs: bad input is a ValueError that names the problem, valid extreme input gets the
right answer, and nothing hangs. One section per part of the package: estimator, metrics, answer checking,
environments, embedders, SetGRPO."""

import math
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import setpo
import setpo.envs.math as md
from setpo.diversity import marginals_by_definition
from setpo.embed import HashedNgramEmbedder, load_embedder
from setpo.envs.bandit import BanditConfig, MultiModalBanditEnv
from setpo.setgrpo import joint_coefficient_set, safe_recovery

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _emb(n=6, d=5, seed=0, dtype=torch.float64):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------- empty input


@pytest.mark.parametrize("call", [
    lambda: setpo.diversity_marginals(torch.empty(0, 4), group_size=3),
    lambda: setpo.diversity_marginals(torch.empty(0, 4), index=[]),
    lambda: setpo.diversity_marginals(torch.empty(0, 4)),
    lambda: setpo.cosine_kernel(torch.empty(0, 3)),
    lambda: setpo.cosine_kernel(torch.empty(3, 0)),
    lambda: setpo.group_advantages([], group_size=3),
    lambda: setpo.group_advantages(torch.empty(0), index=[]),
    lambda: setpo.setpo_advantages([], torch.empty(0, 4), index=[]),
    lambda: setpo.mean_pairwise_similarity(torch.empty(0, 4)),
])
def test_empty_input_is_a_value_error(call):
    with pytest.raises(ValueError, match="empty|no features|0 rows"):
        call()


# ------------------------------------------------------------------------------------------- group ids


def test_ids_keep_their_identity():
    e = _emb(6)
    # 1 and '1' are different groups (numpy would cast both to '1')
    s = setpo.diversity_marginals(e, [1, 1, 1, "1", "1", "1"])
    torch.testing.assert_close(s, setpo.diversity_marginals(e, group_size=3))
    # 1 and 1.0 are one group, as Python's == and hash say
    s = setpo.diversity_marginals(e, [1, 1, 1.0, "x", "x", "x"])
    torch.testing.assert_close(s, setpo.diversity_marginals(e, group_size=3))
    # tuple ids, in a list or an object array
    tuples = [("p", 0), ("p", 0), ("p", 0), ("p", 1), ("p", 1), ("p", 1)]
    torch.testing.assert_close(setpo.diversity_marginals(e, tuples), setpo.diversity_marginals(e, group_size=3))
    obj = np.empty(6, dtype=object)
    obj[:] = tuples
    torch.testing.assert_close(setpo.diversity_marginals(e, obj), setpo.diversity_marginals(e, group_size=3))
    # numpy, torch and list ids of the same values agree; numpy scalars equal Python ints
    for index in ([3, 3, 3, 7, 7, 7], np.array([3, 3, 3, 7, 7, 7]), torch.tensor([3, 3, 3, 7, 7, 7]),
                  np.array([np.int64(3)] * 3 + [7] * 3, dtype=object), [3.0, 3, 3, 7, 7.0, 7]):
        torch.testing.assert_close(setpo.diversity_marginals(e, index), setpo.diversity_marginals(e, group_size=3))


@pytest.mark.parametrize("index, match", [
    (5, "sequence"), (np.array(3), "one-dimensional"), (torch.tensor(2), "one-dimensional"), ("aaabbb", "string"),
    ([float("nan")] * 6, "NaN"), (np.full(6, np.nan), "NaN"), ([[1], [1], [1], [2], [2], [2]], "hashable"),
    ({1: 2}, "ordered"), ({1, 2}, "ordered"), (np.zeros((6, 2)), "one-dimensional"), ([0] * 5, "length"),
])
def test_bad_index(index, match):
    with pytest.raises(ValueError, match=match):
        setpo.diversity_marginals(_emb(6), index)


@given(st.lists(st.sampled_from([0, 1, "1", 1.0, ("a", 1), "a", None, 2.5]), min_size=1, max_size=12))
@FAST
def test_grouping_follows_python_equality(ids):
    """Whatever the mix of id types, rows share a group exactly when their ids are == (and hash alike)."""
    from setpo.groups import Groups

    groups = Groups.build(len(ids), list(ids))
    gid = groups.group_id.tolist()
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (gid[i] == gid[j]) == (ids[i] == ids[j])


# ------------------------------------------------------------------------------------------- knobs


@pytest.mark.parametrize("kwargs, match", [
    (dict(lam=float("nan")), "lam"), (dict(lam=float("inf")), "lam"), (dict(lam="0.5"), "lam"),
    (dict(lam=-0.1), "lam"), (dict(lam=1 + 2j), "lam"), (dict(lam=None), "lam"), (dict(lam=[0.1]), "lam"),
    (dict(eps=0.0), "eps"), (dict(eps=-1e-6), "eps"), (dict(eps=float("nan")), "eps"), (dict(eps="1e-6"), "eps"),
    (dict(group_size=3.7), "group_size"), (dict(group_size="3"), "group_size"), (dict(group_size=True), "group_size"),
    (dict(group_size=0), "group_size"), (dict(group_size=-3), "group_size"), (dict(group_size=4), "divide"),
    (dict(group_size=float("nan")), "group_size"), (dict(estimator="ppo"), "estimator"),
    (dict(estimator=["grpo"]), "estimator"), (dict(estimator=None), "estimator"),
])
def test_bad_knobs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        setpo.setpo_advantages(torch.tensor([1.0, 0.0, 0.5] * 2), _emb(6), **{"group_size": 3, **kwargs})


def test_integer_valued_knobs_and_zero_d_lam_are_fine():
    r, e = torch.tensor([1.0, 0.0, 0.5] * 2), _emb(6)
    ref = setpo.setpo_advantages(r, e, group_size=3, lam=0.5)
    for kw in (dict(group_size=3.0), dict(group_size=np.int64(3)), dict(group_size=torch.tensor(3))):
        torch.testing.assert_close(setpo.setpo_advantages(r, e, lam=0.5, **kw), ref)
    for lam in (np.float32(0.5), torch.tensor(0.5), np.array(0.5)):
        torch.testing.assert_close(setpo.setpo_advantages(r, e, group_size=3, lam=lam), ref)


@pytest.mark.parametrize("make, match", [
    (lambda: torch.tensor([1 + 1j, 0, 0]), "complex"), (lambda: np.array([1 + 1j, 0, 0]), "complex"),
    (lambda: np.array(["1", "0", "0"]), "real numbers"), (lambda: ["a", "b", "c"], "real numbers"),
    (lambda: np.array([1.0, None, 0.0], dtype=object), "numeric|real"), (lambda: None, "numeric"),
    (lambda: "1.0", "numeric"), (lambda: {"a": 1}, "numeric"), (lambda: [[1.0], [2.0, 3.0]], "numeric"),
    (lambda: torch.tensor(1.0), r"shape \(N,\)"), (lambda: np.float64(1.0), r"shape \(N,\)"),
    (lambda: torch.ones(3, 1), r"shape \(N,\)"), (lambda: [1.0, float("nan"), 0.0], "NaN"),
    (lambda: [1.0, float("inf"), 0.0], "NaN or infinite"),
])
def test_bad_rewards(make, match):
    with pytest.raises(ValueError, match=match):
        setpo.group_advantages(make())


@pytest.mark.parametrize("make, match", [
    (lambda: torch.randn(3, 4, dtype=torch.complex64), "complex"), (lambda: np.array([["a"] * 4] * 3), "real"),
    (lambda: torch.randn(3), r"shape \(N, d\)"), (lambda: torch.tensor(1.0), r"shape \(N, d\)"),
    (lambda: torch.randn(2, 3, 4), r"shape \(N, d\)"), (lambda: torch.zeros(3, 4), "zero-norm"),
    (lambda: torch.tensor([[1.0, float("nan")]] * 3), "NaN"), (lambda: torch.tensor([[1.0, float("inf")]] * 3), "NaN"),
])
def test_bad_embeddings(make, match):
    with pytest.raises(ValueError, match=match):
        setpo.diversity_marginals(make())


def test_mismatched_rows_are_named():
    with pytest.raises(ValueError, match="rows"):
        setpo.setpo_advantages(torch.ones(5), _emb(6), group_size=3)
    with pytest.raises(ValueError, match="length"):
        setpo.group_advantages(torch.ones(6), index=[0, 0, 0, 1, 1])


def test_bool_and_integer_inputs_count_as_numbers():
    r = [True, False, True, False, False, True]
    torch.testing.assert_close(setpo.group_advantages(r, group_size=3),  # bools become float32 0/1
                               setpo.group_advantages(torch.tensor([1.0, 0, 1, 0, 0, 1]), group_size=3))
    e = torch.tensor([[1, 0, 2], [0, 3, 1], [2, 2, 0]])
    torch.testing.assert_close(setpo.diversity_marginals(e), setpo.diversity_marginals(e.double()).float())


# ------------------------------------------------------------------------------------------- precision and scale


def test_half_precision_embeddings_do_not_touch_the_rewards():
    r = torch.tensor([2.01, 2.02, 2.03] * 2)
    e = _emb(6, dtype=torch.float32)
    ref = setpo.group_advantages(r, group_size=3)
    for dtype in (torch.bfloat16, torch.float16):
        out = setpo.setpo_advantages(r, e.to(dtype), group_size=3, lam=0)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, ref)
    # a reward far beyond float16's range next to float16 embeddings
    big = torch.tensor([70000.0, 0.0, 1.0] * 2)
    out = setpo.setpo_advantages(big, e.half(), group_size=3, lam=0.1)
    assert bool(torch.isfinite(out).all())
    # bfloat16 rewards themselves are computed in float32
    assert setpo.group_advantages(r.bfloat16(), group_size=3).dtype == torch.float32


def test_half_embeddings_give_the_float32_marginals_of_their_values():
    e = _emb(9, 16, dtype=torch.float32).bfloat16()
    torch.testing.assert_close(setpo.diversity_marginals(e, group_size=3),
                               setpo.diversity_marginals(e.float(), group_size=3))


@pytest.mark.parametrize("scale", [1e-30, 1e-300, 1e20, 1e300])
def test_row_scale_does_not_matter(scale):
    e = _emb(6)
    rows = torch.tensor([1.0, scale, 1.0, scale, 1.0, scale], dtype=torch.float64)[:, None]
    torch.testing.assert_close(setpo.diversity_marginals(e * rows, group_size=3),
                               setpo.diversity_marginals(e, group_size=3))
    if scale in (1e-30, 1e20):  # also in float32, where the squared norms would under/overflow
        torch.testing.assert_close(setpo.diversity_marginals((e * rows).float(), group_size=3),
                                   setpo.diversity_marginals(e.float(), group_size=3), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(setpo.cosine_kernel(e * rows), setpo.cosine_kernel(e))


@given(st.integers(3, 7), st.integers(1, 6), st.floats(-30, 30), st.integers(0, 10_000))
@FAST
def test_marginals_exact_at_any_scale(g, d, log_scale, seed):
    e = _emb(g, d, seed) * 10.0 ** log_scale
    torch.testing.assert_close(setpo.diversity_marginals(e), marginals_by_definition(e), atol=1e-10, rtol=1e-9)


def test_non_contiguous_and_numpy_inputs_agree():
    base = _emb(8, 6)
    e_t = base.T.contiguous().T  # non-contiguous view of the same values
    assert not e_t.is_contiguous()
    idx = [0, 1, 0, 1, 0, 1, 0, 1]
    ref = setpo.diversity_marginals(base, idx)
    torch.testing.assert_close(setpo.diversity_marginals(e_t, idx), ref)
    torch.testing.assert_close(setpo.diversity_marginals(base.numpy(), np.array(idx)), ref)
    torch.testing.assert_close(setpo.diversity_marginals(base[::1, ::1], torch.tensor(idx)), ref)


def test_flat_groups_are_exactly_zero_whatever_the_affine_transform():
    # six equal one-decimal scores: the float mean is one rounding step off, std + eps used to keep 1e-10
    for a, b in ((1.0, 0.0), (3.0, 1.0), (1e-3, 7.0), (1e6, -3.0)):
        r = torch.full((6,), a * 0.7 + b, dtype=torch.float64)
        for est in setpo.ADVANTAGE_ESTIMATORS:
            assert torch.equal(setpo.group_advantages(r, estimator=est), torch.zeros(6, dtype=torch.float64))
        assert not bool(setpo.groups_with_signal(r).any())


# ------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_is_fast_and_exact_for_huge_n():
    t = time.perf_counter()
    assert setpo.pass_at_k(10**9, 5 * 10**8, 1) == 0.5
    assert setpo.pass_at_k(10**9, 1, 1) == pytest.approx(1e-9, rel=1e-12)
    assert setpo.pass_at_k(10**18, 3, 10**6) == pytest.approx(3e-12, rel=1e-5)
    assert setpo.pass_at_k(10**12, 3 * 10**6, 3 * 10**6) == pytest.approx(1 - math.exp(-9), rel=1e-3)
    assert time.perf_counter() - t < 5


@given(st.integers(1, 300), st.data())
@FAST
def test_pass_at_k_matches_exact_rationals(n, data):
    from fractions import Fraction

    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert setpo.pass_at_k(n, c, k) == float(exact)


@pytest.mark.parametrize("args", [(None, 1, 1), (float("inf"), 1, 1), (10, None, 1), (10, 1, float("nan")),
                                  ("10", 1, 1), (True, 1, 1), (10, 1.5, 1), (10, 1, 1 + 0j)])
def test_pass_at_k_bad_input(args):
    with pytest.raises(ValueError, match="integer"):
        setpo.pass_at_k(*args)


# ------------------------------------------------------------------------------------------- answer checking


HOSTILE_ANSWERS = [
    "\\boxed{9^{9^{9}}}", "\\boxed{10^{10^{10}}}", "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "\\boxed{10^10^10}", "\\boxed{2^{99999999}}", "\\boxed{(10^{3})!}", "\\boxed{99999!}",
    "\\boxed{\\binom{1000000000}{500000}}", "\\boxed{" + "1" * 5000 + "}", "$9^{9^{9}}$",
    "x" * 100_000 + "$10^{10^{10}}$", "\\boxed{e^{e^{e^{e}}}}", "\\boxed{\\sum_{k=1}^{1000000000} k}",
    "\\boxed{(x+1)^{999}}", "\\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
    "\\boxed{" + "\\frac{1}{" * 30 + "2" + "}" * 30 + "}", "\\boxed{\\Gamma(10^{9})}",
]


def test_math_reward_is_bounded_in_a_worker_thread():
    """verl scores in a thread pool, where SIGALRM timeouts are off: every answer must still return fast."""
    md.math_reward("\\boxed{1}", "1")  # imports out of the timing
    results = {}

    def score_all():
        for text in HOSTILE_ANSWERS:
            t = time.perf_counter()
            results[text] = (md.math_reward(text, "42"), time.perf_counter() - t)

    worker = threading.Thread(target=score_all, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "math_reward hung on a hostile answer"
    for text, (score, seconds) in results.items():
        assert score == 0.0 and seconds < 10, (text[:40], score, seconds)


def test_refused_answers_are_logged_truncated(caplog):
    text = "\\boxed{9^{9^{9}}" + "9" * 5000 + "}"
    with caplog.at_level("DEBUG", logger="setpo.envs.math"):
        assert md.math_reward(text, "42") == 0.0
    assert caplog.records and all(len(r.getMessage()) < md.LOG_CHARS + 200 for r in caplog.records)


def test_ordinary_answers_still_score():
    assert md.math_reward("so \\boxed{2^{10}}", "1024") == 1.0
    assert md.math_reward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert md.math_reward("\\boxed{x^{2}+1}", "x^2+1") == 1.0
    assert md.math_reward("\\boxed{5!}", "120") == 1.0


@pytest.mark.parametrize("call, match", [
    (lambda: md.extract_boxed(None), "str"), (lambda: md.extract_boxed(b"\\boxed{1}"), "str"),
    (lambda: md.verl_compute_score("gsm8k", "\\boxed{1}"), "ground_truth"),
    (lambda: md.verl_compute_score(data_source="gsm8k", ground_truth="1"), "solution_str"),
    (lambda: md.math_reward(None, "1"), "completion"), (lambda: md.math_reward("\\boxed{1}", None), "gold"),
    (lambda: md.math_reward("\\boxed{1}", "9^{9^{9}}"), "gold answer"),
])
def test_answer_checking_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_extract_boxed_is_linear():
    text = "\\boxed{" + "{}" * 200_000 + "7}"
    t = time.perf_counter()
    assert md.extract_boxed(text).endswith("7")
    assert time.perf_counter() - t < 2


# ------------------------------------------------------------------------------------------- bandit


@pytest.mark.parametrize("action, match", [
    ([1.9, 0.2, 5.99], "whole numbers"), (None, "token ids"), ({"a": 1}, "token ids"), ([2**70, 0, 0], "token ids"),
    ([1, 2], "token ids"), ("abc", "token ids"), ([True, False, True], "token ids"), ([float("nan"), 0, 0], "whole"),
    ([1, 2, 6], "lie in"), ([-1, 0, 0], "lie in"), ([[1, 2, 3]], "token ids"), ([1 + 0j, 0, 0], "token ids"),
])
def test_bandit_bad_actions(action, match):
    env = MultiModalBanditEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(action)
    env.step([1.0, 2, np.int8(3)])  # integer-valued numbers are fine, and a refused action ends nothing
    with pytest.raises(gym.error.ResetNeeded):
        env.step([1, 2, 3])


def test_bandit_world_refuses_rounding_too():
    world = MultiModalBanditEnv().world
    with pytest.raises(ValueError, match="whole"):
        world.rewards([0], torch.tensor([[1.5, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="whole"):
        world.rewards([0.5], [[1, 0, 0]])


@pytest.mark.parametrize("kwargs, match", [
    (dict(surface_noise=float("nan")), "surface_noise"), (dict(surface_noise=-1.0), "surface_noise"),
    (dict(correct_reward=(1.0, float("nan"), 1.0, 1.0)), "correct_reward"),
    (dict(correct_reward=(1.0, float("inf"), 1.0, 1.0)), "correct_reward"), (dict(embed_dim=0), "embed_dim"),
    (dict(num_modes=2.5), "num_modes"), (dict(traj_len=True), "traj_len"), (dict(vocab_size=100, traj_len=10), "exceeds"),
    (dict(num_prompts=0), "num_prompts"), (dict(world_seed=-1), "world_seed"), (dict(correct_reward="1111"), "tuple"),
])
def test_bandit_config_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BanditConfig(**kwargs)


# ------------------------------------------------------------------------------------------- embedders


@pytest.mark.parametrize("kwargs, match", [
    (dict(spec=""), "no embedder"), (dict(spec="   "), "no embedder"), (dict(spec=None), "no embedder"),
    (dict(spec="default", max_seq_length=2), "max_seq_length"), (dict(spec="default", max_seq_length=0), "max_seq_length"),
    (dict(spec="default", max_seq_length=7.5), "max_seq_length"), (dict(spec="hash", batch_size=0), "batch_size"),
    (dict(spec="default", device="gpu"), "device"), (dict(spec="hash:abc"), "hash"),
])
def test_embedder_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_embedder(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when no GPU is visible")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_named(device):
    with pytest.raises(ValueError, match="GPU"):
        load_embedder("default", device=device)


def test_hashed_embedder_on_odd_texts():
    emb = HashedNgramEmbedder(dim=32)
    out = emb(["", " ", "\x00", "é" * 1000, "a\nb"])
    assert out.shape == (5, 32) and bool(torch.isfinite(out).all())
    with pytest.raises(ValueError, match="str"):
        emb(["ok", None])
    with pytest.raises(ValueError, match="single str"):
        emb("text")


# ------------------------------------------------------------------------------------------- SetGRPO


def test_setgrpo_flat_group_is_never_accepted_whatever_the_scale():
    """Six equal scores: the float mean can be one rounding step off, which would leave ~1e-10 coefficients
    that the gate accepts at threshold 0 for r and rejects for 3r + 1. A flat group carries no signal."""
    f = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gram = (f @ f.T)[None]
    for a, b in ((1, 0), (3, 1), (0.01, 5), (100, -2)):
        scores = torch.full((6, 2), a * 0.7 + b, dtype=torch.float64)
        centre, sigma, per = joint_coefficient_set(scores, group_size=6)
        assert torch.equal(centre, torch.zeros(6, dtype=torch.float64)) and not bool(per.any())
        assert not bool(safe_recovery(centre[None], sigma[None], 1.0, gram, 0.0).accepted.any())


@given(st.lists(st.integers(0, 10), min_size=6, max_size=6), st.lists(st.integers(0, 10), min_size=6, max_size=6),
       st.floats(0.01, 100), st.floats(-100, 100))
@FAST
def test_setgrpo_acceptance_is_affine_invariant(sa, sb, a, b):
    """One-decimal scores of 6 responses from two graders: acceptance at τ = 0 and 1 is the same for r and a·r+b."""
    f = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gram = (f @ f.T)[None]
    scores = torch.tensor([sa, sb], dtype=torch.float64).T / 10
    decisions = []
    for s in (scores, a * scores + b):
        centre, sigma, _ = joint_coefficient_set(s, group_size=6)
        decisions.append(safe_recovery(centre[None], sigma[None], 1.0, gram, [0.0, 1.0]).accepted.tolist())
    assert decisions[0] == decisions[1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=10**9, traj_len=10**9), "exceeds"),          # never computes the power
    (dict(num_prompts=10**7), "num_prompts × vocab_size\\*\\*traj_len"),
    (dict(embed_dim=10**6, vocab_size=2, traj_len=10), "vocab_size\\*\\*traj_len × embed_dim"),
    (dict(surface_noise=1e300), "float32"), (dict(correct_reward=(1e300, 1.0, 1.0, 1.0)), "float32"),
])
def test_bandit_config_refuses_worlds_too_big_to_build(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BanditConfig(**kwargs)


def test_bandit_world_pairs_prompts_with_trajectories():
    world = MultiModalBanditEnv(num_prompts=3).world
    tokens = torch.tensor([[0, 1, 2], [3, 4, 5]])
    assert world.modes([0, 2], tokens).tolist() == [int(world.mode_table[0, world.sequence_id(tokens)[0]]),
                                                    int(world.mode_table[2, world.sequence_id(tokens)[1]])]
    assert world.modes(1, tokens).tolist() == world.modes([1, 1], tokens).tolist()  # one id for every row
    for prompts in ([0, 1, 2], [0], [[0, 1]]):
        with pytest.raises(ValueError, match="one per trajectory"):
            world.modes(prompts, tokens)


# ------------------------------------------------------------------------------------------- rubric world


@pytest.mark.parametrize("prompts, responses, match", [
    ([-1], [0], "prompts must be .* in \\[0, 4\\), got -1"),          # would wrap to the last prompt
    ([0], [5], "responses must be .* in \\[0, 5\\), got 5"),
    ([0.0], [1], "prompts must be .*dtype torch.float"), ([True], [1], "prompts must be"),
    ([[0]], [1], "prompts must be .*shape \\(1, 1\\)"), ("ab", [1], "prompts must be"), ({"a": 1}, [1], "prompts"),
    ([0, 1], [1], "pair up one to one, got 2 prompt ids and 1"),
])
def test_rubric_world_checks_its_prompt_and_response_ids(prompts, responses, match):
    from setpo.envs.rubric import RubricTask, RubricToyConfig
    task = RubricTask(RubricToyConfig(n_prompts=4, n_responses=5))
    gen = torch.Generator().manual_seed(0)
    for call in (lambda: task.grade(prompts, responses, gen), lambda: task.regrade(prompts, responses, 2, gen),
                 lambda: task.expert_grade(prompts, responses, 2, gen)):
        with pytest.raises(ValueError, match=match):
            call()


def test_rubric_world_refuses_sizes_it_cannot_hold_and_unseeded_calls():
    from setpo.envs.rubric import RubricTask, RubricToyConfig
    with pytest.raises(ValueError, match="n_prompts × n_responses × feature_dim"):
        RubricToyConfig(n_prompts=10**6, n_responses=10**3, feature_dim=8)
    task = RubricTask(RubricToyConfig(n_prompts=4, n_responses=5))
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="times × N × 2"):
        task.regrade([0, 1], [0, 1], 10**9, gen)
    with pytest.raises(ValueError, match="times × N gradings"):
        task.expert_grade([0, 1], [0, 1], 10**9, gen)
    with pytest.raises(ValueError, match="gen must be a torch.Generator"):
        task.grade([0], [0], None)
    a = task.grade(torch.tensor([0, 3]), torch.tensor([4, 0]), torch.Generator().manual_seed(1))
    b = task.grade([0, 3], np.array([4, 0]), torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------- SetGRPO's public functions

def _one_group():
    f = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    centre = torch.tensor([1.0, -0.5, 0.2, -0.7], dtype=torch.float64)
    return centre, torch.full((4,), 0.3, dtype=torch.float64), f @ f.T


@pytest.mark.parametrize("change, match", [
    (dict(centre=[[1.0, math.nan, 0.0, 0.0]]), "centre contains NaN"),
    (dict(sigma=[[0.3, -0.1, 0.3, 0.3]]), "sigma must be >= 0"),
    (dict(q=-1.0), "q must be >= 0"), (dict(q=math.inf), "q must be finite"), (dict(q="1"), "q must be a real number"),
    (dict(q=True), "q must be a real number"), (dict(gram=torch.eye(3)[None]), "need centre and sigma"),
    (dict(centre=[1.0, 0.0, 0.0, 0.0]), "need centre and sigma"), (dict(centre="abcd"), "centre must be a numeric"),
])
def test_setgrpo_recovery_functions_check_their_inputs_alike(change, match):
    from setpo.setgrpo import gate_scores
    c, s, k = _one_group()
    args = dict(centre=c[None], sigma=s[None], q=1.0, gram=k[None])
    args.update(change)
    for call in (lambda a: safe_recovery(**a), lambda a: gate_scores(**a)):
        with pytest.raises(ValueError, match=match):
            call(args)


def test_setgrpo_knobs_are_checked_by_name():
    from setpo.setgrpo import gate_scores, lm_head_gradient_features, worst_case_agreement
    c, s, k = _one_group()
    for n_bisect, match in ((-1, "n_bisect must be >= 0"), (10**9, "n_bisect must be <= 1100"), (2.5, "n_bisect")):
        with pytest.raises(ValueError, match=match):
            safe_recovery(c[None], s[None], 1.0, k[None], n_bisect=n_bisect)
        with pytest.raises(ValueError, match=match):
            gate_scores(c[None], s[None], 1.0, k[None], n_bisect=n_bisect)
    for rho_max in (-1.0, math.nan, "10"):
        with pytest.raises(ValueError, match="rho_max"):
            gate_scores(c[None], s[None], 1.0, k[None], rho_max=rho_max)
    with pytest.raises(ValueError, match="valid must have centre's shape"):
        safe_recovery(c[None], s[None], 1.0, k[None], valid=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid must be booleans"):
        safe_recovery(c[None], s[None], 1.0, k[None], valid=torch.ones(1, 4))
    for tau in (-0.5, math.nan, "1"):
        with pytest.raises(ValueError, match="tau"):
            worst_case_agreement([0.0, 0.5], c, s, 1.0, k, tau=tau)
    with pytest.raises(ValueError, match="eta contains NaN"):
        worst_case_agreement([0.0, math.nan], c, s, 1.0, k)
    with pytest.raises(ValueError, match="need centre and sigma of shape \\(G,\\)"):
        worst_case_agreement([0.0], c[None], s[None], 1.0, k[None])
    # the checked functions agree with each other where they meet: ρ from gate_scores is safe_recovery's
    rec = safe_recovery(c[None], s[None], 1.0, k[None], with_rho=True)
    assert torch.equal(rec.rho, gate_scores(c[None], s[None], 1.0, k[None]))
    m = worst_case_agreement(rec.eta[0], c, s, 1.0, k)
    assert torch.allclose(m, rec.m_at_eta[0], atol=1e-12)

    h = torch.randn(2, 3, 5)
    z, y, mask = torch.randn(2, 3, 7), torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.ones(2, 3)
    assert lm_head_gradient_features(h, z, y, mask, dims=(2, 2)).shape == (2, 4)
    for kwargs, match in ((dict(tokens=torch.tensor([[1, 2, 3], [4, 5, 7]])), "tokens must be ids in \\[0, 7\\)"),
                          (dict(tokens=torch.tensor([[1, 2, 3], [4, 5, -1]])), "tokens must be ids"),
                          (dict(tokens=y.float()), "integer token ids"), (dict(hidden=h.numpy()), "hidden must be"),
                          (dict(mask=torch.full((2, 3), 2.0)), "mask must hold 0 and 1"),
                          (dict(mask=torch.ones(2, 2)), "mask must have shape"),
                          (dict(temperature=0.0), "temperature must be > 0"), (dict(temperature="1"), "temperature"),
                          (dict(dims=(0, 4)), "dims\\[0\\] must be >= 1"), (dict(dims=(10**9, 1)), "smaller dims"),
                          (dict(dims="16"), "dims must be None or a pair"), (dict(seed=-1), "seed")):
        args = dict(hidden=h, logits=z, tokens=y, mask=mask, dims=(2, 2))
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            lm_head_gradient_features(**args)


def test_setgrpo_risk_test_inputs_are_checked():
    from setpo.setgrpo import (
        SetGRPOConfig,
        binomial_p_value,
        fixed_sequence_test,
        hoeffding_bentkus_p_value,
        ltt_select_threshold,
        reversal_indicators,
    )
    for p_value in (binomial_p_value, hoeffding_bentkus_p_value):
        for failures, n, match in ((5, 3, "cannot exceed"), (-1, 3, "failures must be >= 0"),
                                   (1.5, 3, "failures"), (1, 10**12, "n must be <= 10000000")):
            with pytest.raises(ValueError, match=match):
                p_value(failures, n, 0.1)
        with pytest.raises(ValueError, match="beta must be a real number"):
            p_value(1, 3, "0.1")
    for ps, match in (([0.01, 1.5], "p_values\\[1\\] must be a number in \\[0, 1\\]"), ([-0.1], "p_values\\[0\\]"),
                      (["0.01"], "p_values\\[0\\]"), ("0.01", "sequence of p-values")):
        with pytest.raises(ValueError, match=match):
            fixed_sequence_test(ps, 0.1)
    assert fixed_sequence_test([0.01, math.nan, 0.01], 0.1) == 1   # NaN: not tested, ends the sequence
    acc = torch.ones(30, 2, dtype=torch.bool)
    for kwargs, match in ((dict(accepted=acc.float()), "accepted must be booleans"),
                          (dict(grid=[1.0, math.nan]), "grid\\[1\\] must be finite"), (dict(grid=[]), "empty"),
                          (dict(start=True), "start"), (dict(p_value=["binomial"]), "unknown p_value")):
        args = dict(accepted=acc, reversed_=torch.zeros(30, 2, dtype=torch.bool), grid=[1.0, 0.0])
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            ltt_select_threshold(**args)
    with pytest.raises(ValueError, match="need coef \\(B, T, G\\)"):
        reversal_indicators(torch.zeros(2, 3, 4), torch.zeros(2, 3), torch.zeros(2, 4, 4))
    for kwargs, match in ((dict(lam=-0.1), "lam must be >= 0"), (dict(lam=math.nan), "lam must be finite"),
                          (dict(n_bisect=-2), "n_bisect"), (dict(recalibrate_every=2.5), "recalibrate_every"),
                          (dict(sigma_min="0.25"), "sigma_min"), (dict(tau_grid="3210"), "tau_grid"),
                          (dict(tau_grid=(1.0, "0")), "tau_grid\\[1\\]"), (dict(estimator="nope"), "estimator"),
                          (dict(identity_geometry=1), "identity_geometry"), (dict(alpha="0.1"), "alpha"),
                          (dict(ltt_start_factor=0), "ltt_start_factor"), (dict(eps=0.0), "eps")):
        with pytest.raises(ValueError, match=match):
            SetGRPOConfig(**kwargs)


def test_a_config_changed_after_construction_is_checked_as_at_construction():
    from setpo.envs.rubric import RubricTask, RubricToyConfig
    from setpo.setgrpo import SetGRPOConfig

    cfg = RubricToyConfig(n_prompts=4, n_responses=5, grader_noise=[0.1, 0.2])
    assert cfg.grader_noise == (0.1, 0.2)  # kept as a tuple: the checked pair cannot change in place
    task = RubricTask(cfg)
    for name, value, match in (("slip_prob", (5.0, 0.0), "slip_prob\\[0\\]"), ("n_prompts", 0, "n_prompts"),
                               ("expert_noise", math.nan, "expert_noise"), ("grader_noise", "ab", "grader_noise")):
        with pytest.raises(ValueError, match=match):
            setattr(cfg, name, value)
    cfg.n_prompts = 6.0  # a good value is taken, as the constructor takes it
    assert cfg.n_prompts == 6 and type(cfg.n_prompts) is int
    assert task.config.n_prompts == 4 and task.features.shape[0] == 4  # the world keeps the config it was built with

    sg_cfg = SetGRPOConfig()
    sg_cfg.lam = 0.1  # changing a knob later is fine ...
    assert sg_cfg.lam == 0.1
    for name, value in (("lam", -1.0), ("n_bisect", 10**9), ("tau_grid", (0.0, 1.0)), ("alpha", 1.5)):
        with pytest.raises(ValueError, match=name):  # ... a bad value is refused, as at construction
            setattr(sg_cfg, name, value)
    assert sg_cfg.lam == 0.1 and sg_cfg.alpha == 0.1
