"""SetPO on TRL: λ = 0 is TRL's GRPO bit for bit; λ > 0 adds exactly λ·s; presets carry the paper's settings."""

import copy

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import setpo
from setpo import PRESETS, diversity_marginals
from setpo.completions import completion_text
from setpo.embed import HashedNgramEmbedder
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer
from setpo.trl import (
    SetPOConfig,
    SetPODAPOConfig,
    SetPOGSPOConfig,
    SetPOTrainer,
    config_for,
    group_diversity_stats,
)

G = 4
PROMPTS = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]


def digit_reward(completions, **_):
    """A reward that varies within groups of a random model's samples: the text's length mod 5."""
    return [float(len(c) % 5) for c in completions]


def odd_none_reward(completions, **_):
    """Unscorable (None) for completions of odd length, so some rows have no reward at all."""
    return [None if len(c) % 2 else float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)
    return tok, model


def _common(tmp_path, **kw):
    return dict(output_dir=str(tmp_path), num_generations=G, per_device_train_batch_size=len(PROMPTS) * G,
                max_completion_length=8, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                temperature=1.0, beta=0.0, seed=0, disable_tqdm=True, **kw)


def _batch():
    # what TRL's RepeatSampler hands over: each prompt G times in a row
    return [{"prompt": p} for p in PROMPTS for _ in range(G)]


def _score(trainer, seed=0, reward=None):
    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(_batch())


def _loss(trainer, out):
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; we call the loss outside it
    return trainer.compute_loss(trainer.model, out)


def _dataset():
    return Dataset.from_list([{"prompt": p} for p in PROMPTS])


def _pair(tok, model, tmp_path, **setpo_kwargs):
    """A λ = 0 SetPO trainer that logs no diversity (the GRPO baseline) and a SetPO trainer built with
    setpo_kwargs and a HashedNgramEmbedder(64), each on a copy of model, both scored on the same batch.
    Returns (base, setpo, base_out, setpo_out, the base's completion texts)."""
    base = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward,
                        args=SetPOConfig(**_common(tmp_path / "a"), setpo_lambda=0.0, setpo_log_diversity=False),
                        train_dataset=_dataset(), processing_class=tok)
    setpo = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward,
                         args=SetPOConfig(**_common(tmp_path / "b"), **setpo_kwargs),
                         train_dataset=_dataset(), processing_class=tok, embedder=HashedNgramEmbedder(64))
    a, b = _score(base), _score(setpo)
    return base, setpo, a, b, tok.batch_decode(a["completion_ids"], skip_special_tokens=True)


def test_lambda_zero_is_trl_grpo_exactly(tiny, tmp_path):
    tok, model = tiny
    plain = GRPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward, args=GRPOConfig(**_common(tmp_path / "a")),
                        train_dataset=_dataset(), processing_class=tok)
    setpo = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward,
                         args=SetPOConfig(**_common(tmp_path / "b"), setpo_lambda=0.0, embedder="hash"),
                         train_dataset=_dataset(), processing_class=tok)
    a, b = _score(plain), _score(setpo)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    assert torch.equal(a["advantages"], b["advantages"])
    assert a["advantages"].abs().sum() > 0  # the batch carries signal, so the comparison means something
    assert torch.equal(_loss(plain, a), _loss(setpo, b))
    # with λ = 0 the diversity metrics are still logged (setpo_log_diversity), for GRPO baselines
    assert "setpo/pairwise_similarity" in setpo._metrics["train"]


def test_lambda_adds_exactly_lambda_times_marginals(tiny, tmp_path):
    lam = 0.5
    base, setpo, a, b, texts = _pair(*tiny, tmp_path, setpo_lambda=lam)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    s = diversity_marginals(HashedNgramEmbedder(64)(texts), group_size=G)
    assert s.abs().max() > 0
    assert torch.equal(b["advantages"], a["advantages"] + lam * s)  # bit for bit: Â = Ā + λ·s on TRL's Ā
    assert not torch.equal(_loss(base, a), _loss(setpo, b))
    m = setpo._metrics["train"]
    assert m["setpo/s_mean"][-1] == pytest.approx(float(s.mean()), abs=1e-6)
    assert m["setpo/s_std"][-1] == pytest.approx(float(s.std()), abs=1e-6)
    assert 0 <= m["setpo/pairwise_similarity"][-1] <= 1
    # the completions table TRL logs shows the advantages that were used
    assert list(setpo._logs["advantages"]) == b["advantages"].tolist()
    assert setpo.last_setpo_batch["texts"] == texts


@pytest.mark.parametrize("term,units", [("pairwise", "absolute"), ("setpo", "term_std")])
def test_diversity_term_and_lambda_units(tiny, tmp_path, term, units):
    from setpo.advantages import flat_groups
    from setpo.diversity import diversity_term

    lam = 0.3
    _, tr, a, b, texts = _pair(*tiny, tmp_path, setpo_lambda=lam, setpo_diversity=term, setpo_lambda_units=units)
    d = diversity_term(term, HashedNgramEmbedder(64)(texts), group_size=G)
    if units == "term_std":
        d = d / d.std()
    # the trainer adds λ·s to TRL's advantages: Ā + λ·d, λ·d rounded then added, bit for bit
    assert torch.equal(b["advantages"], a["advantages"] + lam * d.to(a["advantages"].dtype))
    emb = HashedNgramEmbedder(64)(texts)
    assert torch.equal(b["advantages"], setpo.setpo_advantages(None, emb, group_size=G, base=a["advantages"],
                                                               lam=lam, diversity=term, lam_units=units))
    rewards = torch.tensor(digit_reward(texts), dtype=torch.float64)
    expect_flat = float(flat_groups(rewards, group_size=G).double().mean())
    assert tr._metrics["train"]["setpo/flat_group_fraction"][-1] == pytest.approx(expect_flat)


def test_unknown_term_or_units_are_refused(tmp_path):
    with pytest.raises(ValueError, match="setpo_diversity"):
        SetPOConfig(**_common(tmp_path), setpo_diversity="entropy")
    with pytest.raises(ValueError, match="setpo_lambda_units"):
        SetPOConfig(**_common(tmp_path), setpo_lambda_units="sigma")


def test_unscorable_rows_keep_zero_advantage(tiny, tmp_path):
    tok, model = tiny
    tr = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=odd_none_reward,
                      args=SetPOConfig(**_common(tmp_path), setpo_lambda=1.0, embedder="hash"),
                      train_dataset=_dataset(), processing_class=tok)
    out = _score(tr, seed=3)
    texts = tok.batch_decode(out["completion_ids"], skip_special_tokens=True)
    odd = torch.tensor([len(t) % 2 == 1 for t in texts])
    assert odd.any() and (~odd).any()
    assert torch.all(out["advantages"][odd] == 0)
    # and they leave their group's baseline: the scored rows get (r - mean) / (std + 1e-4) over the scored rows
    # of their group alone (TRL's rule since 1.6, the floor in pyproject.toml; older TRL counted them as reward 0)
    r = torch.tensor([float("nan") if v is None else v for v in odd_none_reward(texts)]).view(-1, G)
    count = (~r.isnan()).sum(1, keepdim=True)
    mean = r.nanmean(1, keepdim=True)
    std = ((r - mean) ** 2).nansum(1, keepdim=True).div(count - 1).sqrt()   # NaN for a lone scored row
    base = ((r - mean) / (std + 1e-4)).nan_to_num(0.0).flatten()
    assert base.abs().sum() > 0
    s = tr.last_setpo_batch["s"]
    torch.testing.assert_close(out["advantages"], base + s, rtol=0, atol=1e-5)


def test_the_oldest_tested_set_is_the_admitted_floor():
    """make test runs the adapter's tests at tests/trl-oldest.txt's pins: they must be pyproject's floors."""
    import re
    from pathlib import Path

    from packaging.version import Version

    root = Path(__file__).resolve().parents[1]
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", (root / "tests" / "trl-oldest.txt").read_text(), re.M))
    floors = dict(re.findall(r'^\s*"(trl|transformers)>=([^,"]+)[,"]', (root / "pyproject.toml").read_text(), re.M))
    assert set(pins) == set(floors) == {"trl", "transformers"}
    assert all(Version(pins[name]) == Version(floors[name]) for name in pins), (pins, floors)


def test_presets_come_from_the_table(tmp_path):
    gspo = SetPOGSPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert gspo.importance_sampling_level == "sequence"
    assert (gspo.epsilon, gspo.epsilon_high) == (PRESETS["gspo"].clip_low, PRESETS["gspo"].clip_high) == (3e-4, 4e-4)
    assert gspo.setpo_lambda == PRESETS["gspo"].lam and gspo.loss_type == "grpo"
    dapo = SetPODAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (dapo.loss_type, dapo.epsilon, dapo.epsilon_high, dapo.setpo_lambda) == ("dapo", 0.2, 0.28, 0.2)
    grpo = SetPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (grpo.epsilon, grpo.epsilon_high, grpo.setpo_lambda) == (0.2, 0.2, PRESETS["grpo"].lam)
    cd = config_for("countdown", output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=3,
                    per_device_train_batch_size=6)
    assert cd.setpo_lambda == 0.5 and type(cd) is SetPOConfig
    assert type(config_for("gspo", output_dir=str(tmp_path), use_cpu=True, bf16=False)) is SetPOGSPOConfig
    with pytest.raises(ValueError, match="unknown preset"):
        config_for("ppo", output_dir=str(tmp_path))


def test_bad_settings_raise(tiny, tmp_path):
    tok, model = tiny
    with pytest.raises(ValueError, match="num_generations >= 3"):
        SetPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2,
                    per_device_train_batch_size=2, setpo_lambda=0.5)
    with pytest.raises(ValueError, match="finite"):
        SetPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, setpo_lambda=float("nan"))
    with pytest.raises(ValueError, match=">= 0"):
        SetPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, setpo_lambda=-0.1)
    with pytest.raises(ValueError, match="SetPOConfig"):
        SetPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward, args=GRPOConfig(**_common(tmp_path)),
                     train_dataset=_dataset(), processing_class=tok)


@pytest.mark.parametrize("cls", [SetPOConfig, SetPOGSPOConfig, SetPODAPOConfig])
def test_two_training_steps_per_preset(tiny, tmp_path, cls):
    tok, model = tiny
    args = cls(**_common(tmp_path, max_steps=2, logging_steps=1, steps_per_generation=1), embedder="hash")
    tr = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=digit_reward, args=args,
                      train_dataset=_dataset(), processing_class=tok)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    logs = [h for h in tr.state.log_history if "setpo/s_mean" in h]
    assert len(logs) == 2 and all(h["setpo/s_std"] > 0 for h in logs)
    assert any(not torch.equal(p, q) for p, q in zip(before, tr.model.parameters(), strict=True))


def test_completion_text_and_group_stats():
    assert completion_text("abc") == "abc"
    msgs = [{"role": "assistant", "content": "x = 1"}, {"role": "tool", "content": [{"type": "text", "text": "ok"}]}]
    assert completion_text(msgs) == "x = 1\nok"
    with pytest.raises(ValueError):
        completion_text(3)
    emb = torch.tensor([[1.0, 0], [1, 0], [0, 1], [1, 1], [1, 0], [0, 1]])
    stats = group_diversity_stats(emb, [True, True, True, False, True, True], ["a", "a", "b", "c", "d", None], 3)
    assert stats["distinct_correct"] == pytest.approx((2 + 1) / 2)
    # group 1: k = 1, 0, 0 (mean 1/3); group 2: cos 45° twice, 0 (mean (2·0.7071)/3)
    assert stats["pairwise_similarity"] == pytest.approx((1 / 3 + 2 * 2 ** -0.5 / 3) / 2, abs=1e-5)
    with pytest.raises(ValueError):
        group_diversity_stats(emb, [True] * 6, ["a"] * 6, 4)
