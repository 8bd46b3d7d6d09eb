"""The shared-prompt fast paths are exact or not used (issue 47, items 1 and 2).

``setpo.trl.rollouts.shared_prompt_generate`` (the trainer's CPU rollouts) and ``setpo.trl.shared_prefix`` (the
loss's shared prompt pass) are used only where they give the plain path's tokens / log-probs / gradients up to
float rounding: plain full-attention cache layers, no dropout in train mode, ``generate`` options they give
exactly. Tiny models built from configs of the architectures that are not (a sliding window shorter than the
prompt on Qwen2, Mistral and Gemma-2, an MoE model's router logits, dropout) show the fallback taken and TRL's
own result; the options that are given exactly (repetition penalty, min-p, typical-p, n-gram bans, bf16 weights,
an MoE model without router logits) show the same tokens; the gradients through TRL's fused LM head are
compared with a check that fails when they differ.
"""

import copy
import logging

import pytest
import torch
from datasets import Dataset
from transformers import (GenerationConfig, Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM)

import setpo.trl.shared_prefix as shared_prefix
import setpo.trl.trainer as trainer_module
from helpers import packed_rows, quiet_trainer
from setpo.trl import SetPOTrainer, config_for
from setpo.trl.rollouts import (FastPathRefused, left_pad, prompt_cache, rollout_refusal, sampling_refusal,
                                shared_prompt_generate)
from setpo.trl.shared_prefix import SharedPrefixModel, shared_pass_refusal
from setpo.trl.tiny_models import ModelSize, build_chat_tokenizer, build_model, build_tokenizer

G = 4
#: 7 to 10 tokens each: longer than the window of 4 below
PROMPTS = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]
WINDOW = 4


def _config_kwargs(tok):
    return dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)


def _moe_kwargs():
    return dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


ARCHITECTURES = {
    "qwen2-sliding": lambda kw: Qwen2ForCausalLM(Qwen2Config(**kw, use_sliding_window=True, sliding_window=WINDOW,
                                                            max_window_layers=0)),
    "mistral-sliding": lambda kw: MistralForCausalLM(MistralConfig(**kw, sliding_window=WINDOW)),
    "gemma2-sliding": lambda kw: Gemma2ForCausalLM(Gemma2Config(**kw, head_dim=16, sliding_window=WINDOW)),
    "qwen2-dropout": lambda kw: Qwen2ForCausalLM(Qwen2Config(**kw, attention_dropout=0.1)),
    "qwen2moe": lambda kw: Qwen2MoeForCausalLM(Qwen2MoeConfig(**kw, **_moe_kwargs())),
    "qwen2moe-router-logits": lambda kw: Qwen2MoeForCausalLM(Qwen2MoeConfig(**kw, **_moe_kwargs(),
                                                                             output_router_logits=True)),
}


def _build(name, tok, seed=0):
    torch.manual_seed(seed)
    model = ARCHITECTURES[name](_config_kwargs(tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def dense(tok):
    return build_model(tok, ModelSize(64, 2, 4, 2, 128, 128), seed=0).eval()


def _prompt_ids(tok):
    return [tok(p)["input_ids"] for p in PROMPTS for _ in range(G)]


def _sampling(tok, **options):
    return GenerationConfig(**{**dict(max_new_tokens=10, do_sample=True, temperature=1.0,
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id), **options})


def _plain(model, tok, prompt_ids, config, seed):
    ids, mask = left_pad(prompt_ids, tok.pad_token_id)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]


def _shared(model, tok, prompt_ids, config, seed):
    torch.manual_seed(seed)
    return shared_prompt_generate(model, prompt_ids, tok.pad_token_id, generation_config=config)


# --- rollouts: what is refused, and the check after the prompt pass -------------------------------------------


@pytest.mark.parametrize("name", ["qwen2-sliding", "mistral-sliding", "gemma2-sliding"])
def test_a_sliding_window_shorter_than_the_prompt_is_refused(tok, name):
    """Before the check, these rollouts copied the sliding layers' last window - 1 keys into preallocated layers:
    Qwen2 and Mistral sampled other tokens than generate (5 to 10 of 12 rows per seed), Gemma-2 crashed."""
    model = _build(name, tok).eval()
    prompt_ids = _prompt_ids(tok)
    assert min(len(p) for p in prompt_ids) > WINDOW
    assert "sliding" in rollout_refusal(model)
    with pytest.raises(FastPathRefused, match="sliding"):
        _shared(model, tok, prompt_ids, _sampling(tok), seed=0)


def test_the_prompt_pass_checks_the_cache_it_returns(tok, monkeypatch):
    """A cache the config did not announce (here: the config check switched off) is caught after the prompt
    pass, before anything random has run, and never copied into preallocated layers."""
    import setpo.trl.rollouts as rollouts

    model = _build("mistral-sliding", tok).eval()
    monkeypatch.setattr(rollouts, "cache_refusal", lambda model: None)
    assert rollout_refusal(model) is None
    ids, mask = left_pad([tok(p)["input_ids"] for p in PROMPTS], tok.pad_token_id)
    with pytest.raises(FastPathRefused, match="DynamicSlidingWindowLayer"):
        prompt_cache(model, ids, mask, G, capacity=ids.shape[1] + 4)
    with pytest.raises(FastPathRefused, match="DynamicSlidingWindowLayer"):
        _shared(model, tok, _prompt_ids(tok), _sampling(tok), seed=0)


def test_dropout_is_refused_in_train_mode_only(tok):
    model = _build("qwen2-dropout", tok)
    assert "attention_dropout=0.1" in rollout_refusal(model.train())
    assert "attention_dropout=0.1" in shared_pass_refusal(model)
    model.eval()
    assert rollout_refusal(model) is None and shared_pass_refusal(model) is None
    prompt_ids = _prompt_ids(tok)
    for seed in range(2):  # in eval mode dropout draws nothing: the shared rollouts are generate's
        assert torch.equal(_plain(model, tok, prompt_ids, _sampling(tok), seed),
                           _shared(model, tok, prompt_ids, _sampling(tok), seed))


def test_a_dropout_module_in_train_mode_is_refused(dense):
    """Dropout that no config field names (a LoRA adapter's, say) is found among the modules."""
    model = copy.deepcopy(dense).train()
    model.model.layers[0].mlp.act_fn = torch.nn.Sequential(model.model.layers[0].mlp.act_fn, torch.nn.Dropout(0.05))
    assert "model.layers.0.mlp.act_fn.1" in rollout_refusal(model)
    assert rollout_refusal(model.eval()) is None


@pytest.mark.parametrize("options, match", [
    (dict(num_beams=2, do_sample=False), "beam search"),
    (dict(num_return_sequences=2), "several sequences"),
    (dict(cache_implementation="static"), "cache implementation"),
    (dict(return_dict_in_generate=True), "return_dict_in_generate"),
])
def test_generate_options_it_does_not_give_exactly_are_refused(tok, dense, options, match):
    """Each of these crashed or returned something else on the shared cache before the check."""
    assert match in sampling_refusal(_sampling(tok, **options))
    with pytest.raises(FastPathRefused, match=match):
        _shared(dense, tok, _prompt_ids(tok), _sampling(tok, **options), seed=0)
    with pytest.raises(FastPathRefused, match=match):  # as a keyword next to the config, too
        torch.manual_seed(0)
        shared_prompt_generate(dense, _prompt_ids(tok), tok.pad_token_id, generation_config=_sampling(tok),
                               **{k: v for k, v in options.items() if k != "do_sample"})


# --- rollouts: the same tokens where it is used ---------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(repetition_penalty=1.3), dict(min_p=0.05), dict(typical_p=0.9),
                                     dict(no_repeat_ngram_size=2), dict(do_sample=False, repetition_penalty=1.2)],
                         ids=["repetition_penalty", "min_p", "typical_p", "no_repeat_ngram", "greedy"])
def test_sampling_options_give_generate_s_tokens(tok, dense, options):
    prompt_ids = _prompt_ids(tok) + [tok("1 1 = 2\n")["input_ids"]] * 2
    config = _sampling(tok, **options)
    assert rollout_refusal(dense, config) is None
    for seed in range(2):
        assert torch.equal(_plain(dense, tok, prompt_ids, config, seed), _shared(dense, tok, prompt_ids, config, seed))


def test_bf16_weights_give_generate_s_tokens(tok, dense):
    model = copy.deepcopy(dense).to(torch.bfloat16)
    prompt_ids = _prompt_ids(tok)
    for seed in range(3):
        plain = _plain(model, tok, prompt_ids, _sampling(tok), seed)
        assert torch.equal(plain, _shared(model, tok, prompt_ids, _sampling(tok), seed))
    assert len({tuple(r) for r in plain.tolist()}) > G  # samples, not one repeated row


def test_moe_rollouts_give_generate_s_tokens(tok):
    """Routing is per token: MoE rollouts are shared. (With output_router_logits=True in the config, transformers
    5.10's own generate fails on Qwen2-MoE: its load-balancing loss meets a one-token step against the whole
    mask. TRL's path fails there too.)"""
    model = _build("qwen2moe", tok).eval()
    assert rollout_refusal(model) is None
    prompt_ids = _prompt_ids(tok)
    assert torch.equal(_plain(model, tok, prompt_ids, _sampling(tok), 0), _shared(model, tok, prompt_ids,
                                                                                 _sampling(tok), 0))


# --- the trainer: TRL's own path and one line of log where refused ----------------------------------------------


def _trainer(tok, model, tmp_path, **kwargs):
    return quiet_trainer(tok, model, tmp_path, PROMPTS, G, **kwargs)


def _rollouts(trainer, seed=0, train=True):
    trainer.model.train(train)
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(G)])


@pytest.fixture
def shared_calls(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(len(args[1]))
        return shared_prompt_generate(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "shared_prompt_generate", counted)
    return calls


@pytest.mark.parametrize("name, reason", [("mistral-sliding", "sliding_window=4"),
                                          ("qwen2-dropout", "attention_dropout=0.1")])
def test_the_trainer_falls_back_to_trl_and_says_why_once(tok, tmp_path, shared_calls, caplog, name, reason):
    model = _build(name, tok)
    on = _trainer(tok, model, tmp_path / "on")
    off = _trainer(tok, model, tmp_path / "off", setpo_shared_prompt_rollouts=False)
    with caplog.at_level(logging.WARNING, logger="setpo.trl.rollouts"):
        outs = [_rollouts(on, seed) for seed in (0, 1)]
    assert shared_calls == []  # refused before the unwrapped model was asked for
    lines = [r.getMessage() for r in caplog.records if "setpo_shared_prompt_rollouts not used" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0]
    assert [(switch, reason in why) for switch, why in on.setpo_fallbacks] == [("setpo_shared_prompt_rollouts", True)]
    for seed, out in zip((0, 1), outs, strict=True):  # TRL's own path, random numbers and all
        assert torch.equal(out["completion_ids"], _rollouts(off, seed)["completion_ids"])


def test_the_trainer_falls_back_when_the_prompt_pass_returns_another_cache(tok, tmp_path, shared_calls, monkeypatch,
                                                                         caplog):
    """The check after the prompt pass (FastPathRefused from inside the unwrapped model's block) also ends in
    TRL's path, with the same tokens: nothing random ran before it."""
    import setpo.trl.rollouts as rollouts

    monkeypatch.setattr(rollouts, "cache_refusal", lambda model: None)
    monkeypatch.setattr(trainer_module, "rollout_refusal", lambda *a: None)
    model = _build("mistral-sliding", tok)
    on = _trainer(tok, model, tmp_path / "on")
    off = _trainer(tok, model, tmp_path / "off", setpo_shared_prompt_rollouts=False)
    with caplog.at_level(logging.WARNING, logger="setpo.trl.rollouts"):
        out = _rollouts(on, 0)
    assert shared_calls == [len(PROMPTS) * G]
    assert any("DynamicSlidingWindowLayer" in r.getMessage() for r in caplog.records)
    assert torch.equal(out["completion_ids"], _rollouts(off, 0)["completion_ids"])


def test_the_trainer_shares_prompts_with_repetition_penalty_and_min_p(tok, dense, tmp_path, shared_calls):
    """TRL's own sampling options reach generate through the trainer's generation config: the same tokens."""
    options = dict(repetition_penalty=1.3, min_p=0.05, top_k=20)
    on = _trainer(tok, dense, tmp_path / "on", **options)
    off = _trainer(tok, dense, tmp_path / "off", setpo_shared_prompt_rollouts=False, **options)
    out = _rollouts(on)
    assert shared_calls == [len(PROMPTS) * G]
    assert torch.equal(out["completion_ids"], _rollouts(off)["completion_ids"])


@pytest.mark.parametrize("flag", ["use_transformers_paged", "use_transformers_continuous_batching"])
def test_paged_generation_is_left_to_trl_under_either_name(tok, dense, tmp_path, shared_calls, monkeypatch, flag):
    """TRL 1.6 (the floor) names paged generation use_transformers_paged, later TRL
    use_transformers_continuous_batching: with either set on the trainer, the call goes to TRL's own method."""
    from trl import GRPOTrainer

    tr = _trainer(tok, dense, tmp_path)
    trl_calls = []
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn",
                        lambda self, prompt_ids, *a, **k: trl_calls.append(len(prompt_ids)) or ([[1]] * len(prompt_ids),
                                                                                                None))
    for name in ("use_transformers_paged", "use_transformers_continuous_batching"):
        setattr(tr, name, name == flag)
    tr.model.train()
    tr._generate_single_turn(_prompt_ids(tok), None, {}, G)
    assert trl_calls == [len(PROMPTS) * G] and shared_calls == []
    setattr(tr, flag, False)  # and with neither set, the shared rollouts run
    tr._generate_single_turn(_prompt_ids(tok), None, {}, G)
    assert trl_calls == [len(PROMPTS) * G] and shared_calls == [len(PROMPTS) * G]


# --- the shared prompt pass: refusals and gradients through TRL's fused LM head ---------------------------------


def _chat_batch(chat, g=3):
    """Three prompts (left-padded) with g right-padded completions each, shuffled: a generation batch."""
    prompts = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nName a number.<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]
    gen = torch.Generator().manual_seed(0)
    rows = [(chat(p, add_special_tokens=False)["input_ids"],
             torch.randint(5, 60, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen).tolist())
            for p in prompts for _ in range(g)]
    return packed_rows(rows, chat.pad_token_id, gen)


def _loss_trainer(chat, model, tmp_path, share, bf16=False):
    args = config_for("grpo", output_dir=str(tmp_path), setpo_lambda=0.0, setpo_log_diversity=False,
                      num_generations=3, per_device_train_batch_size=3, max_completion_length=8, report_to=[],
                      use_cpu=True, setpo_share_prompt_pass=share, gradient_checkpointing=False, bf16=bf16)
    return SetPOTrainer(model=copy.deepcopy(model), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                        args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 3), processing_class=chat)


def _chat_model(chat, name=None):
    if name is None:
        return build_model(chat, ModelSize(64, 2, 2, 1, 128, 128), seed=1)
    torch.manual_seed(1)
    kw = _config_kwargs(chat)
    return ARCHITECTURES[name](kw)


def test_moe_router_logits_take_trl_s_pass(tmp_path, caplog):
    """TRL 1.16 asks an MoE model for router logits in the loss (aux_loss_enabled); before the check the shared
    pass crashed in the load-balancing loss (router logits of B·(C+1) tokens against a B·(P+C) mask)."""
    import inspect

    from trl import GRPOTrainer

    if "compute_aux_loss" not in inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters:
        pytest.skip("this TRL computes no load-balancing loss in GRPO")
    chat = build_chat_tokenizer()
    chat.padding_side = "left"
    model = _chat_model(chat, "qwen2moe")
    ids, mask, P, C = _chat_batch(chat)
    assert "router logits" in shared_pass_refusal(model, router_logits=True)
    assert shared_pass_refusal(model) is None
    off, on = (_loss_trainer(chat, model, tmp_path / str(s), s) for s in (False, True))
    on.model.train()
    off.model.train()
    with caplog.at_level(logging.WARNING, logger="setpo.trl.rollouts"):
        a = on._get_per_token_logps_and_entropies(on.model, ids, mask, C, compute_aux_loss=True)
        on._get_per_token_logps_and_entropies(on.model, ids, mask, C)  # the old policy's pass: the same pass
    b = off._get_per_token_logps_and_entropies(off.model, ids, mask, C, compute_aux_loss=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])  # log-probs and aux loss: TRL's, bit for bit
    lines = [r.getMessage() for r in caplog.records if "setpo_share_prompt_pass not used" in r.getMessage()]
    assert len(lines) == 1 and "router logits" in lines[0]


def test_router_logits_in_the_config_or_the_call_take_the_plain_pass():
    chat = build_chat_tokenizer()
    model = _chat_model(chat, "qwen2moe-router-logits").train()
    assert "output_router_logits=True" in shared_pass_refusal(model)
    ids, mask, P, C = _chat_batch(chat)
    wrapper = SharedPrefixModel(model, P)
    with torch.no_grad():
        shared = wrapper(input_ids=ids, attention_mask=mask).logits
        plain = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(shared, plain) and wrapper.refusals


def test_dropout_takes_the_plain_pass_with_the_same_random_numbers():
    chat = build_chat_tokenizer()
    model = _chat_model(chat, "qwen2-dropout").train()
    ids, mask, P, C = _chat_batch(chat)
    wrapper = SharedPrefixModel(model, P)
    torch.manual_seed(3)
    shared = wrapper(input_ids=ids, attention_mask=mask).logits
    torch.manual_seed(3)
    plain = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(shared, plain) and "attention_dropout" in wrapper.refusals[0]


def test_sliding_window_takes_the_plain_pass():
    chat = build_chat_tokenizer()
    model = _chat_model(chat, "mistral-sliding").eval()
    ids, mask, P, C = _chat_batch(chat)
    assert P > WINDOW and "sliding_window" in shared_pass_refusal(model)
    wrapper = SharedPrefixModel(model, P)
    with torch.no_grad():
        assert torch.equal(wrapper(input_ids=ids, attention_mask=mask).logits,
                           model(input_ids=ids, attention_mask=mask).logits)


def _trainer_grads(trainer, ids, mask, C):
    """Log-probs of the completion tokens (TRL's own method: the fused LM head on TRL >= 1.16) and the gradient of
    their sum over the valid positions, for every parameter."""
    trainer.model.train()
    logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, C)[0]
    valid = mask[:, -C:].bool()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    return logps.detach(), torch.autograd.grad(logps[valid].sum(), params)


def _max_relative_gap(grads_a, grads_b):
    return max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
               for a, b in zip(grads_a, grads_b, strict=True))


#: the largest gradient gap allowed, relative to each tensor's largest entry: float32 rounding (measured 7e-7),
#: and bf16 autocast's rounding of the gradients themselves (one bf16 step, 2^-7 = 0.0078, measured 0.0077)
GRADIENT_TOLERANCE = {False: 1e-5, True: 2e-2}


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("name", [None, "qwen2moe"], ids=["qwen2", "qwen2moe-no-router-loss"])
def test_gradients_through_trl_s_loss_path_match_and_the_check_can_tell(tmp_path, monkeypatch, name, bf16):
    """The shared pass's gradients through TRL's own log-prob method (its fused LM head: TRL 1.16 passes
    fused_lm_head=True and labels), in float32 and under bf16 autocast as training runs, equal the plain pass's
    to rounding; with the prompt cache cut from the graph (the prompt pass's gradient lost: the log-probs stay
    the same) the gap is about 1, far past the tolerance, so the comparison can tell."""
    chat = build_chat_tokenizer()
    chat.padding_side = "left"
    model = _chat_model(chat, name)
    if name is not None:
        model.config.router_aux_loss_coef = 0.0  # TRL then asks for no router logits: the shared pass is used
    ids, mask, P, C = _chat_batch(chat)
    off, on = (_loss_trainer(chat, model, tmp_path / str(s), s, bf16) for s in (False, True))

    seen = []
    forward = SharedPrefixModel.forward

    def spy(self, input_ids, attention_mask, **kwargs):
        seen.append(set(kwargs))
        return forward(self, input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(SharedPrefixModel, "forward", spy)
    splits = []
    real = shared_prefix.distinct_prompts
    monkeypatch.setattr(shared_prefix, "distinct_prompts", lambda *a: splits.append(real(*a)) or splits[-1])
    logps_plain, grads_plain = _trainer_grads(off, ids, mask, C)
    logps_shared, grads_shared = _trainer_grads(on, ids, mask, C)
    assert [len(first) for first, _ in splits] == [3]  # the shared pass ran: 9 rows, 3 prompt passes
    import trl.trainer.utils

    if hasattr(trl.trainer.utils, "add_fused_lm_head"):  # TRL 1.16: the fused head, as in training
        assert "fused_lm_head" in seen[0] and "labels" in seen[0]
    valid = mask[:, -C:].bool()
    torch.testing.assert_close(logps_shared[valid], logps_plain[valid], rtol=1e-5, atol=1e-5)
    assert _max_relative_gap(grads_shared, grads_plain) < GRADIENT_TOLERANCE[bf16]

    def detached(cache, rows):  # the prompt pass cut from the graph: its gradient never arrives
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.detach().index_select(0, rows), \
                layer.values.detach().index_select(0, rows)

    monkeypatch.setattr(shared_prefix, "select_rows", detached)
    logps_cut, grads_cut = _trainer_grads(on, ids, mask, C)
    torch.testing.assert_close(logps_cut[valid], logps_plain[valid], rtol=1e-5, atol=1e-5)  # same values ...
    assert _max_relative_gap(grads_cut, grads_plain) > 0.5  # ... other gradients: the check above would fail
