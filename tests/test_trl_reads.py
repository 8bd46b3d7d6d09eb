"""What SetPO's kernel reads, on TRL: the answer reader, the answer-key kernel, the correctness gate, and the
exploit monitor's warning in a tiny training run where the term is paid in length (and none where it is not)."""

import copy
import warnings

import pytest
import torch
from datasets import Dataset

from helpers import completion_texts, score_batch
from setpo import setpo_advantages
from setpo.embed import HashedNgramEmbedder, TextKeyEmbedder
from setpo.reads import SetPOExploitWarning, kernel_texts
from setpo.trl import SetPOConfig, SetPOTrainer
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer

G = 4
PROMPTS = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]


def length_reward(completions, **_):
    """Varies within groups of a random model's samples: the text's length mod 3."""
    return [float(len(c) % 3) for c in completions]


def first_char(text):
    """A stand-in answer reader: the completion's first non-blank character; None for a blank completion and
    for one starting with 0-3 (so that some rows have nothing to read; the tiny model writes mostly digits)."""
    text = text.strip()
    return None if not text or text[0] in "0123" else text[0]


class LengthPaysEmbedder:
    """An embedder under which longer texts are less alike: a shared direction plus length × a direction of the
    text's own (random, seeded by the text; nearly orthogonal to every other text's in 256 dimensions), so
    cos(a, b) ≈ 1 / sqrt((1 + ℓ_a²)(1 + ℓ_b²)). A kernel like this lets a policy earn SetPO's term by writing more."""

    def __call__(self, texts):
        rows = []
        for t in texts:
            seed = int.from_bytes(t.encode()[:7].ljust(7, b"\0"), "little") + len(t)
            own = torch.randn(256, generator=torch.Generator().manual_seed(seed))
            rows.append(torch.cat([torch.ones(1), len(t) / 8 * own / own.norm()]))
        return torch.stack(rows)


@pytest.fixture(scope="module")
def tiny():
    """A tiny random model whose end-of-sequence token is likely enough that completion lengths vary (its
    embedding row points along the mean final hidden state)."""
    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        d = model.model(**ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.get_input_embeddings().weight[tok.eos_token_id] = 3.5 * d / d.norm()
    return tok, model


def _config(tmp_path, **kw):
    return SetPOConfig(output_dir=str(tmp_path), num_generations=G, per_device_train_batch_size=len(PROMPTS) * G,
                       max_completion_length=8, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                       temperature=1.0, beta=0.0, seed=0, disable_tqdm=True, logging_steps=1, **kw)


def _trainer(tiny, tmp_path, embedder=None, answer_reader=None, **kw):
    tok, model = tiny
    if isinstance(embedder, str):  # a spec goes through the config, as a user writes it
        embedder, kw = None, {**kw, "embedder": embedder}
    return SetPOTrainer(model=copy.deepcopy(model), reward_funcs=length_reward, args=_config(tmp_path, **kw),
                        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS] * 4),
                        processing_class=tok, embedder=embedder, answer_reader=answer_reader)


def _score(trainer, seed=0):
    return score_batch(trainer, PROMPTS, G, seed)


def _texts(trainer, out):
    return completion_texts(trainer, out)


@pytest.mark.parametrize("gate", [None, 1.0])
def test_the_kernel_reads_the_answer_and_the_gate_keeps_the_sets_to_right_rows(tiny, tmp_path, gate):
    lam = 0.5
    base = _trainer(tiny, tmp_path / "a", setpo_lambda=0.0, setpo_log_diversity=False)
    tr = _trainer(tiny, tmp_path / "b", embedder=HashedNgramEmbedder(64), answer_reader=first_char,
                  setpo_lambda=lam, setpo_kernel_reads="answer", setpo_gate_reward=gate)
    a, b = _score(base), _score(tr)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    texts = _texts(base, a)
    read, readable, _ = kernel_texts(texts, "answer", first_char)
    rows = torch.tensor(readable)
    if gate is not None:
        rows &= torch.tensor(length_reward(texts)) >= gate
    assert 0 < int(rows.sum()) < len(texts)  # some rows are left out, so the comparison means something
    _, s = setpo_advantages(None, HashedNgramEmbedder(64)(read), group_size=G, base=a["advantages"], lam=lam,
                            term_rows=rows, return_marginals=True)
    assert s[~rows].abs().max() == 0 and s[rows].abs().max() > 0
    torch.testing.assert_close(b["advantages"], a["advantages"] + lam * s.float(), rtol=0, atol=1e-6)
    assert torch.equal(tr.last_setpo_batch["in_sets"], rows)


def test_answer_key_kernel_counts_equal_answers_as_one(tiny, tmp_path):
    tr = _trainer(tiny, tmp_path, embedder="key", answer_reader=first_char, setpo_lambda=0.5,
                  setpo_kernel_reads="answer")
    assert isinstance(tr.embedder, TextKeyEmbedder)
    out = _score(tr)
    texts = _texts(tr, out)
    emb = tr.last_setpo_batch["emb"]
    keys = [first_char(t) for t in texts]
    same = emb @ emb.T
    for i in range(len(texts)):
        for j in range(len(texts)):
            if keys[i] is not None and keys[j] is not None:
                assert same[i, j] == float(keys[i] == keys[j])


def test_bad_reader_settings_are_clear_errors(tiny, tmp_path):
    with pytest.raises(ValueError, match="kernel_reads='answer' needs an answer reader"):
        _trainer(tiny, tmp_path, setpo_kernel_reads="answer", embedder="hash")
    with pytest.raises(ValueError, match="setpo_kernel_reads must be one of"):
        _config(tmp_path, setpo_kernel_reads="answers")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        _config(tmp_path, setpo_answer_reader="no_such_module:f")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        _config(tmp_path, setpo_answer_reader="setpo.envs.short_answers:nope")
    with pytest.raises(ValueError, match="setpo_gate_reward must be None or a finite number"):
        _config(tmp_path, setpo_gate_reward=float("nan"))
    # a string naming a function works like the function itself
    assert _config(tmp_path, setpo_answer_reader="setpo.envs.short_answers:answer_key").setpo_answer_reader


def _train(trainer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return [w for w in caught if issubclass(w.category, SetPOExploitWarning)]


def test_monitor_warns_once_when_the_term_is_paid_in_length(tiny, tmp_path):
    tr = _trainer(tiny, tmp_path, embedder=LengthPaysEmbedder(), answer_reader=first_char, setpo_lambda=0.5,
                  max_steps=8, setpo_monitor_window=4)
    caught = _train(tr)
    corr = [h.get("setpo/s_length_corr") for h in tr.state.log_history if "setpo/s_mean" in h]
    assert len(corr) == 8 and None not in corr and sum(corr) / len(corr) >= 0.3
    messages = [str(w.message) for w in caught]
    assert sum("paid in length" in m for m in messages) == 1  # once, not every step
    assert all("kernel_reads='answer'" in m for m in messages)
    assert any("setpo/unread_fraction" in h for h in tr.state.log_history)
    assert tr.exploit_monitor.window == 4 and tr.exploit_monitor.decisions["length"] >= 1


def test_monitor_is_quiet_when_the_kernel_reads_only_the_answer(tiny, tmp_path):
    tr = _trainer(tiny, tmp_path, embedder="key", answer_reader=first_char, setpo_lambda=0.5,
                  setpo_kernel_reads="answer", max_steps=8, setpo_monitor_window=2)
    assert _train(tr) == []
    corr = [h.get("setpo/s_length_corr") for h in tr.state.log_history if "setpo/s_mean" in h]
    assert len(corr) == 8 and sum(c is not None for c in corr) >= 4  # measured, and still no warning
    assert tr.exploit_monitor.decisions["length"] == 0  # no length decision is taken where s cannot see length


def test_a_tiny_model_trained_into_the_exploit_at_the_length_cap_is_caught(tmp_path):
    """The exploit of docs/studies/short_answers.md, in miniature: a constant reward that reads only the first
    character (so GRPO's advantage is 0 and λ·s is the whole signal) and a whole-completion kernel under which
    longer text is more diverse. A model that starts by ending right after its answer learns to write to the length
    cap instead; the monitor says so, in unread text."""
    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():  # end-of-sequence first: the answer and nothing after it
        d = model.model(**ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.get_input_embeddings().weight[tok.eos_token_id] = 12.0 * d / d.norm()
    args = _config(tmp_path, learning_rate=0.03, lr_scheduler_type="constant", setpo_lambda=1.0,
                   setpo_lambda_units="term_std", max_steps=32, setpo_monitor_window=4)
    tr = SetPOTrainer(model=model, reward_funcs=lambda completions, **_: [1.0] * len(completions), args=args,
                      train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS] * 40), processing_class=tok,
                      embedder=LengthPaysEmbedder(), answer_reader=first_char_any)
    messages = [str(w.message) for w in _train(tr)]
    logs = [h for h in tr.state.log_history if "setpo/unread_fraction" in h]
    first, last = logs[:4], logs[-8:]
    assert sum(h["setpo/unread_fraction"] for h in first) / 4 < 0.3  # it began without filler
    assert min(h["completions/clipped_ratio"] for h in last) == 1.0  # every completion at the cap
    assert sum(h["setpo/unread_fraction"] for h in last) / 8 >= 0.75  # and carrying text after its answer
    unread = [m for m in messages if "paid in unread text" in m]
    assert len(unread) == 1 and "up from" in unread[0]


def first_char_any(text):
    """The answer reader of the exploit test: the completion's first non-blank character."""
    text = text.strip()
    return text[:1] or None


def nan_for_odd(completions, **_):
    """Scores completions of even length (1.0) and leaves the others unscored (None), as a reward function that
    only knows some tasks does."""
    return [1.0 if len(c) % 2 == 0 else None for c in completions]


def test_rows_no_reward_function_scored_are_out_of_the_gated_set(tiny, tmp_path):
    """Ω⁺ = {r_i >= τ}: a row with no r_i is not in it, whatever τ (TRL's nansum would read it as 0 >= 0)."""
    tok, model = tiny
    args = _config(tmp_path, setpo_lambda=0.5, setpo_gate_reward=0.0)
    tr = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=nan_for_odd, args=args,
                      train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS] * 4), processing_class=tok,
                      embedder=HashedNgramEmbedder(64), answer_reader=first_char)
    out = _score(tr)
    texts = _texts(tr, out)
    unscored = torch.tensor([len(t) % 2 == 1 for t in texts])
    assert 0 < int(unscored.sum()) < len(texts)
    in_sets, s = tr.last_setpo_batch["in_sets"], tr.last_setpo_batch["s"]
    assert not bool(in_sets[unscored].any())  # out of Ω⁺, though their nansum (0) passes τ = 0
    assert s[unscored].abs().max() == 0 and out["advantages"][unscored].abs().max() == 0  # Â = 0 there
    assert "setpo/groups_without_marginal" in tr._metrics["train"]


def test_trainer_and_config_refuse_bad_values_when_built(tiny, tmp_path):
    import numpy as np

    tok, model = tiny
    key = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=length_reward, processing_class=tok,
                       args=_config(tmp_path, setpo_lambda=0.5, setpo_kernel_reads="answer"), embedder="key",
                       train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), answer_reader=first_char)
    assert isinstance(key.embedder, TextKeyEmbedder)  # a spec string given to the trainer, as in the config
    with pytest.raises(ValueError, match=r"SetPOTrainer\(embedder=...\): 'no/such/folder' is neither"):
        SetPOTrainer(model=copy.deepcopy(model), reward_funcs=length_reward, processing_class=tok,
                     args=_config(tmp_path), embedder="no/such/folder",
                     train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    with pytest.raises(ValueError, match=r"SetPOConfig.embedder: 'no/such/folder' is neither.*nothing is downloaded"):
        SetPOTrainer(model=copy.deepcopy(model), reward_funcs=length_reward, processing_class=tok,
                     args=_config(tmp_path, embedder="no/such/folder"),
                     train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    with pytest.raises(ValueError, match=r"SetPOTrainer\(embedder=...\) must be an embedder"):
        SetPOTrainer(model=copy.deepcopy(model), reward_funcs=length_reward, processing_class=tok,
                     args=_config(tmp_path), embedder=3,
                     train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    for field, value, match in [("embedder", "hash:0", "positive integer"), ("embedder", "", "SetPOConfig.embedder"),
                                ("setpo_answer_reader", ".x:f", "absolute module"),
                                ("setpo_answer_reader", "a b:f", "absolute module"),
                                ("setpo_monitor_window", 0, "setpo_monitor_window must be an integer >= 1"),
                                ("setpo_monitor_window", 2.5, "setpo_monitor_window"),
                                ("setpo_monitor", "yes", "setpo_monitor must be True or False"),
                                ("setpo_gate_reward", True, "setpo_gate_reward"),
                                ("setpo_lambda", np.bool_(True), "setpo_lambda")]:
        with pytest.raises(ValueError, match=match):
            _config(tmp_path, **{field: value})
    # numpy numbers are numbers
    cfg = _config(tmp_path, setpo_gate_reward=np.float32(1.0), setpo_lambda=np.float64(0.5),
                  setpo_monitor_window=np.int64(3))
    assert (cfg.setpo_gate_reward, cfg.setpo_lambda, cfg.setpo_monitor_window) == (1.0, 0.5, 3)
    assert type(cfg.setpo_gate_reward) is float and type(cfg.setpo_monitor_window) is int


def test_pairwise_similarity_leaves_out_rows_with_nothing_to_read():
    from setpo.trl.trainer import group_diversity_stats

    emb = TextKeyEmbedder()(["", "", "", "a", "b", "a"])  # group 0: nothing to read anywhere; group 1: a, b, a
    readable = [False, False, False, True, True, True]
    stats = group_diversity_stats(emb, [True] * 6, list("xyzabc"), 3, readable)
    assert stats["pairwise_similarity"] == pytest.approx(1 / 3)  # group 1 alone, not (1 + 1/3) / 2
    import math

    assert math.isnan(group_diversity_stats(emb[:3], [True] * 3, list("xyz"), 3, readable[:3])["pairwise_similarity"])
