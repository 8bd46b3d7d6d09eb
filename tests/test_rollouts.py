"""Shared-prompt rollouts (setpo.trl.rollouts): the samples plain ``generate`` draws under the same seeds, and the
CPU default of ``SetPOTrainer``, which ``setpo_shared_prompt_rollouts=False`` turns back into TRL's own call."""

import pytest
import torch
from transformers import GenerationConfig

import setpo.trl.trainer as trainer_module
from helpers import quiet_trainer
from setpo.trl.rollouts import completion_lists, left_pad, prompt_cache, prompt_runs, shared_prompt_generate
from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer

G = 4
PROMPTS = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, ModelSize(64, 2, 4, 2, 128, 128), seed=0).eval()
    return tok, model


def test_prompt_runs_and_padding():
    assert prompt_runs([[1, 2], [1, 2], [3], [3], [3], [1, 2]]) == ([[1, 2], [3], [1, 2]], [2, 3, 1])
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0, pad_to_multiple_of=4)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]] and mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    with pytest.raises(ValueError, match="empty prompt"):
        left_pad([[1], []], pad_token_id=0)
    with pytest.raises(ValueError, match="counts"):
        prompt_cache(None, ids, mask, [1])


def test_completion_lists_cut_after_the_first_end_token():
    rows = torch.tensor([[4, 9, 2, 9], [4, 4, 4, 4], [7, 7, 7, 3]])
    assert completion_lists(rows, [9, 3]) == [[4, 9], [4, 4, 4, 4], [7, 7, 7, 3]]


def _plain(model, tok, prompt_ids, config, seed):
    ids, mask = left_pad(prompt_ids, tok.pad_token_id)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=20)])
def test_shared_prompt_samples_equal_plain_generate(tiny, sampling):
    """Same seed, same tokens: prompts of different lengths (left padding), G rows each, and a run of another
    length (TRL's batches are whole groups; any consecutive repeats are shared)."""
    tok, model = tiny
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS for _ in range(G)] + [tok("1 1 = 2\n")["input_ids"]] * 2
    config = GenerationConfig(max_new_tokens=12, do_sample=True, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id, **sampling)
    for seed in range(4):
        plain = _plain(model, tok, prompt_ids, config, seed)
        torch.manual_seed(seed)
        shared = shared_prompt_generate(model, prompt_ids, tok.pad_token_id, generation_config=config)
        assert torch.equal(plain, shared), seed
        assert len({tuple(r) for r in plain[:G].tolist()}) > 1  # the rows of a group differ: they are samples


def test_rollouts_stop_when_every_row_has_ended(tiny):
    """No decode step after the last row's end token: with every token an end token each row ends at its first,
    so the batch is one token wide and the model ran twice (the shared prompt pass, one step), not 12 times; with
    half the vocabulary the batch is as wide as its longest row, and equal to plain ``generate``'s."""
    tok, model = tiny
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS for _ in range(G)]
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        config = GenerationConfig(max_new_tokens=12, do_sample=True, pad_token_id=tok.pad_token_id,
                                  eos_token_id=list(range(len(tok))))
        torch.manual_seed(0)
        out = shared_prompt_generate(model, prompt_ids, tok.pad_token_id, generation_config=config)
    finally:
        hook.remove()
    assert out.shape == (len(prompt_ids), 1) and len(calls) == 2
    half = list(range(0, len(tok), 2))
    config = GenerationConfig(max_new_tokens=12, do_sample=True, pad_token_id=tok.pad_token_id, eos_token_id=half)
    torch.manual_seed(1)
    out = shared_prompt_generate(model, prompt_ids, tok.pad_token_id, generation_config=config)
    longest = max(len(row) for row in completion_lists(out, half))
    assert out.shape[1] == longest < 12 and torch.equal(out, _plain(model, tok, prompt_ids, config, 1))


def test_the_shared_prompt_pass_gives_generate_s_first_logits(tiny):
    """Why the samples agree: the first sampled token's logits from the shared cache equal those of a full pass
    over each padded row, to float rounding."""
    tok, model = tiny
    ids, mask = left_pad([tok(p)["input_ids"] for p in PROMPTS], tok.pad_token_id)
    inputs = prompt_cache(model, ids, mask, G)
    with torch.no_grad():
        positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        last = model(input_ids=inputs["input_ids"][:, -1:], attention_mask=inputs["attention_mask"],
                     position_ids=positions[:, -1:], past_key_values=inputs["past_key_values"]).logits[:, -1]
        full = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    torch.testing.assert_close(last, full.repeat_interleave(G, dim=0), atol=1e-5, rtol=1e-5)


def _trainer(tok, model, tmp_path, **kwargs):
    return quiet_trainer(tok, model, tmp_path, PROMPTS, G, **kwargs)


def test_trainer_uses_shared_prompts_by_default_and_the_switch_turns_them_off(tiny, tmp_path, monkeypatch):
    tok, model = tiny
    calls = []

    def counted(*args, **kwargs):
        calls.append(len(args[1]))
        return shared_prompt_generate(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "shared_prompt_generate", counted)
    batch = [{"prompt": p} for p in PROMPTS for _ in range(G)]  # TRL's RepeatSampler: each prompt G times in a row
    outs = []
    for switch, folder in ((True, "on"), (False, "off")):
        tr = _trainer(tok, model, tmp_path / folder, **({} if switch else {"setpo_shared_prompt_rollouts": False}))
        assert tr.args.setpo_shared_prompt_rollouts is switch
        tr.model.train()
        torch.manual_seed(0)
        outs.append(tr._generate_and_score_completions(batch))
        assert calls == [len(batch)]  # called once, for the default trainer only
    on, off = outs
    assert torch.equal(on["completion_ids"], off["completion_ids"])
    assert torch.equal(on["completion_mask"], off["completion_mask"])


def test_preallocated_layer_holds_what_a_dynamic_layer_holds():
    from transformers.cache_utils import DynamicLayer

    from setpo.trl.rollouts import PreallocatedLayer

    torch.manual_seed(0)
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    dynamic = DynamicLayer()
    dynamic.update(keys, values)
    pre = PreallocatedLayer(keys, values, capacity=7)
    for _ in range(2):
        k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        for got, want in zip(pre.update(k, v), dynamic.update(k, v), strict=True):
            assert torch.equal(got, want)
    assert pre.get_seq_length() == dynamic.get_seq_length() == 7
    # transformers >= 5.10 passes the query length, older releases (the floor, 5.2) the cache positions
    import inspect

    query = 1 if "query_length" in inspect.signature(DynamicLayer.get_mask_sizes).parameters else torch.arange(7, 8)
    assert pre.get_mask_sizes(query) == dynamic.get_mask_sizes(query)
    with pytest.raises(ValueError, match="holds 7 positions"):
        pre.update(k, v)
    with pytest.raises(ValueError, match="capacity"):
        PreallocatedLayer(keys, values, capacity=4)


def test_grouped_attention_is_sdpa_on_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from setpo.trl.rollouts import grouped_query_sdpa

    class Module:
        num_key_value_groups = 3
        is_causal = True

    torch.manual_seed(0)
    query, key, value = torch.randn(4, 6, 1, 8), torch.randn(4, 2, 9, 8), torch.randn(4, 2, 9, 8)
    mask = torch.ones(4, 1, 1, 9, dtype=torch.bool)
    mask[0, :, :, :3] = False  # a left-padded row
    got, _ = grouped_query_sdpa(Module(), query, key, value, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.3)
    assert got.shape == want.shape == (4, 1, 6, 8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
