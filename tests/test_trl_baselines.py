"""SetPOTrainer's baselines and diagnostics on a tiny CPU model: DRA-GRPO's reward rescaling (against a direct
transcription of its formula), a setpo base estimator in place of TRL's (pass@K), the verifier's one-hot kernel,
and per-phase wall-clock seconds that leave log_history untouched."""

import copy
import math

import pytest
import torch
from datasets import Dataset
from helpers import TIME_KEYS
from trl import GRPOConfig, GRPOTrainer

from helpers import completion_texts, score_batch
from setpo import diversity_marginals
from setpo.advantages import group_advantages
from setpo.diversity import kernel_marginals
from setpo.embed import HashedNgramEmbedder, SolutionKeyEmbedder
from setpo.trl import SetPOConfig, SetPOTrainer
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer

G = 4
PROMPTS = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]
TRL_EPS = 1e-4


def digit_reward(completions, **_):
    """Varies within groups of a random model's samples: the text's length mod 5."""
    return [float(len(c) % 5) for c in completions]


def parity_reward(completions, **_):
    """0/1: the text has even length (Pass@k's closed form is written for 0/1 rewards)."""
    return [float(len(c) % 2 == 0) for c in completions]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)


def _common(tmp_path, **kw):
    return dict(output_dir=str(tmp_path), num_generations=G, per_device_train_batch_size=len(PROMPTS) * G,
                max_completion_length=8, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                temperature=1.0, beta=0.0, seed=0, disable_tqdm=True, **kw)


def _dataset():
    return Dataset.from_list([{"prompt": p} for p in PROMPTS])


def _trainer(tiny, tmp_path, reward=digit_reward, embedder=None, cls=SetPOTrainer, config=SetPOConfig, **kw):
    tok, model = tiny
    return cls(model=copy.deepcopy(model), reward_funcs=reward, args=config(**_common(tmp_path, **kw)),
               train_dataset=_dataset(), processing_class=tok,
               **({"embedder": embedder} if embedder is not None else {}))


def _score(trainer, seed=0):
    return score_batch(trainer, PROMPTS, G, seed)


def _texts(trainer, out):
    return completion_texts(trainer, out)


def _trl_normalise(r: torch.Tensor) -> torch.Tensor:
    """TRL's default (scale_rewards="group"): (r - group mean) / (unbiased group std + 1e-4)."""
    x = r.view(-1, G)
    return ((x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + TRL_EPS)).flatten()


def _dra_by_hand(texts, rewards, embedder):
    """r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)) over each group, k = clamp(cos, 0, 1), written out row by row."""
    e = embedder(texts).double()
    out = []
    for i in range(len(texts)):
        g0 = i // G * G
        sim = 0.0
        for j in range(g0, g0 + G):
            if j != i:
                cos = float(e[i] @ e[j] / (e[i].norm() * e[j].norm()))
                sim += min(max(cos, 0.0), 1.0)
        out.append(float(rewards[i]) / (1 + sim))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_dra_rescales_rewards_before_trl_normalises(tiny, tmp_path, lam):
    tr = _trainer(tiny, tmp_path, embedder=HashedNgramEmbedder(64), setpo_lambda=lam, setpo_reward_adjustment="dra",
                  setpo_log_diversity=False)
    out = _score(tr)
    texts = _texts(tr, out)
    batch = tr.last_setpo_batch
    assert batch["texts"] == texts
    r = torch.tensor(digit_reward(texts), dtype=torch.float64)
    assert torch.equal(batch["rewards"].double(), r)  # the stash keeps the original rewards
    r_tilde = _dra_by_hand(texts, r, HashedNgramEmbedder(64))
    assert not torch.allclose(r_tilde, r)  # the rescaling does something here
    torch.testing.assert_close(batch["rewards_adjusted"].double(), r_tilde, rtol=1e-6, atol=1e-6)
    expect = _trl_normalise(r_tilde)
    if lam:
        expect = expect + lam * diversity_marginals(HashedNgramEmbedder(64)(texts), group_size=G).double()
    assert expect.abs().sum() > 0
    torch.testing.assert_close(out["advantages"].double(), expect, rtol=0, atol=1e-4)
    # TRL's normalisation of r would give something else: the rescaling is in the advantages
    assert not torch.allclose(out["advantages"].double(), _trl_normalise(r), atol=1e-3)
    m = tr._metrics["train"]
    scale = r_tilde[r != 0] / r[r != 0]
    assert m["setpo/dra_scale_mean"][-1] == pytest.approx(float(batch["dra_scale"].mean()))
    torch.testing.assert_close(batch["dra_scale"].double()[r != 0], scale, rtol=1e-6, atol=1e-6)
    assert 0 < m["setpo/dra_scale_mean"][-1] <= 1
    # TRL's reward metric and completions table show the original task reward; its advantages column what was used
    assert m["reward"][-1] == pytest.approx(float(r.mean()), abs=1e-6)
    assert list(tr._logs["rewards"]["digit_reward"]) == pytest.approx(r.tolist())
    assert list(tr._logs["advantages"]) == pytest.approx(out["advantages"].tolist(), abs=1e-6)


def test_dra_counts_correct_on_original_rewards(tiny, tmp_path):
    # every response "correct" at reward >= 0 on the original scale; r̃ would not change that, so use a
    # threshold only the original rewards reach: the largest reward in the batch
    tr = _trainer(tiny, tmp_path, embedder=HashedNgramEmbedder(64), setpo_lambda=0.0, setpo_reward_adjustment="dra")
    out = _score(tr)
    texts = _texts(tr, out)
    r = torch.tensor(digit_reward(texts))
    top = float(r.max())
    r_tilde = tr.last_setpo_batch["rewards_adjusted"]
    assert float(r_tilde.max()) < top  # no rescaled reward reaches it (every response has some similarity)
    tr2 = _trainer(tiny, tmp_path / "b", embedder=HashedNgramEmbedder(64), setpo_lambda=0.0,
                   setpo_reward_adjustment="dra", setpo_correct_reward=top)
    _score(tr2)
    expect = sum(len({texts[i].strip() for i in range(b, b + G) if r[i] >= top}) for b in range(0, len(r), G)) / 3
    assert expect > 0
    assert tr2._metrics["train"]["setpo/distinct_correct"][-1] == pytest.approx(expect)


def test_pass_at_k_estimator_replaces_trl_advantages(tiny, tmp_path):
    tr = _trainer(tiny, tmp_path, reward=parity_reward, setpo_lambda=0.0, setpo_log_diversity=False,
                  setpo_estimator="pass@3")
    assert not tr.setpo_active  # no embeddings needed: the estimator alone
    out = _score(tr, seed=1)
    texts = _texts(tr, out)
    r = torch.tensor(parity_reward(texts))
    assert not all(float(x.max()) == float(x.min()) for x in r.view(-1, G))  # some group has signal
    expect = group_advantages(r, group_size=G, estimator="pass@3", eps=TRL_EPS)
    torch.testing.assert_close(out["advantages"], expect.to(out["advantages"].dtype), rtol=0, atol=1e-6)
    # the paper's closed form for 0/1 rewards, group by group
    k, n = 3, G
    for b in range(0, len(r), G):
        x = r[b:b + G]
        n_neg = int((x == 0).sum())
        mean = 1 - math.comb(n_neg, k) / math.comb(n, k)
        std = math.sqrt(mean * (1 - mean))
        for i in range(G):
            if std == 0:
                want = 0.0
            elif x[i] == 1:
                want = (1 - mean) / (std + TRL_EPS)
            else:
                want = (1 - mean - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / (std + TRL_EPS)
            assert float(out["advantages"][b + i]) == pytest.approx(want, abs=1e-5)
    assert list(tr._logs["advantages"]) == pytest.approx(out["advantages"].tolist(), abs=1e-6)


def test_estimator_with_lambda_adds_s_to_the_estimator(tiny, tmp_path):
    lam = 0.3
    tr = _trainer(tiny, tmp_path, embedder=HashedNgramEmbedder(64), setpo_lambda=lam, setpo_estimator="rloo")
    out = _score(tr)
    texts = _texts(tr, out)
    base = group_advantages(torch.tensor(digit_reward(texts)), group_size=G, estimator="rloo", eps=TRL_EPS)
    s = diversity_marginals(HashedNgramEmbedder(64)(texts), group_size=G)
    torch.testing.assert_close(out["advantages"], base + lam * s, rtol=0, atol=1e-5)
    assert list(tr._logs["advantages"]) == pytest.approx(out["advantages"].tolist(), abs=1e-6)


def test_trl_estimator_is_plain_grpo_bit_for_bit(tiny, tmp_path):
    plain = _trainer(tiny, tmp_path / "a", cls=GRPOTrainer, config=GRPOConfig)
    ours = _trainer(tiny, tmp_path / "b", embedder=HashedNgramEmbedder(64), setpo_lambda=0.0, setpo_estimator="trl")
    a, b = _score(plain), _score(ours)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    assert torch.equal(a["advantages"], b["advantages"]) and a["advantages"].abs().sum() > 0
    assert list(plain._logs["advantages"]) == list(ours._logs["advantages"])


def _key_log():
    seen = []

    def key(prompt, completion):
        seen.append(prompt)
        return len(completion) % 3  # coarse on purpose: many responses share a key

    return key, seen


def test_solution_key_embedder_in_the_trainer_gives_the_one_hot_marginals(tiny, tmp_path):
    lam = 0.5
    key, seen = _key_log()
    base = _trainer(tiny, tmp_path / "a", setpo_lambda=0.0, setpo_log_diversity=False)
    tr = _trainer(tiny, tmp_path / "b", embedder=SolutionKeyEmbedder(key), setpo_lambda=lam)
    a, b = _score(base), _score(tr)
    texts = _texts(tr, b)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    assert seen == [p for p in PROMPTS for _ in range(G)]  # the prompts' texts, aligned with the completions
    keys = torch.tensor([len(t) % 3 for t in texts]).view(-1, G)
    kernel = (keys[:, :, None] == keys[:, None, :]).double()  # k = 1 for the same key, else 0
    s = kernel_marginals(kernel).flatten()
    assert s.abs().max() > 0
    torch.testing.assert_close(tr.last_setpo_batch["s"].double(), s, rtol=0, atol=1e-6)
    torch.testing.assert_close(b["advantages"].double(), a["advantages"].double() + lam * s, rtol=0, atol=1e-5)


def test_setpo_seconds_and_deterministic_log_history(tiny, tmp_path):
    def run(sub):
        tr = _trainer(tiny, tmp_path / sub, embedder=HashedNgramEmbedder(64), setpo_lambda=0.5,
                      setpo_reward_adjustment="dra", max_steps=2, logging_steps=1, steps_per_generation=1)
        tr.train()
        return tr

    one, two = run("a"), run("b")
    for tr in (one, two):
        assert set(tr.setpo_seconds) == {"generation", "embedding", "update"}
        assert all(v >= 0 for v in tr.setpo_seconds.values())
        assert tr.setpo_seconds["generation"] > 0 and tr.setpo_seconds["update"] > 0
        assert tr.setpo_seconds["embedding"] > 0
        assert not any("seconds" in k for h in tr.state.log_history for k in h)

    def strip(tr):
        return [{k: v for k, v in h.items() if k not in TIME_KEYS} for h in tr.state.log_history]

    assert len(strip(one)) == 3 and any("setpo/dra_scale_mean" in h for h in strip(one))
    assert strip(one) == strip(two)


def test_bad_config_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"setpo_reward_adjustment.*'none', 'dra'"):
        SetPOConfig(**_common(tmp_path), setpo_reward_adjustment="drapo")
    with pytest.raises(ValueError, match=r"setpo_estimator.*pass@K"):
        SetPOConfig(**_common(tmp_path), setpo_estimator="ppo")
    with pytest.raises(ValueError, match=r"pass@5.*num_generations >= 5"):
        SetPOConfig(**_common(tmp_path), setpo_estimator="pass@5")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        SetPOConfig(**_common(tmp_path), setpo_estimator="grpo", multi_objective_aggregation="normalize_then_sum")
    SetPOConfig(**_common(tmp_path), setpo_estimator="pass@4", setpo_reward_adjustment="dra")  # fine
