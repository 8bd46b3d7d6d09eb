"""setpo.trl.shared_prefix: one prompt pass per distinct prompt gives the full pass's log-probs and gradients."""

import pytest
import torch

from helpers import packed_rows
from setpo.trl.shared_prefix import SharedPrefixModel, distinct_prompts
from setpo.trl.tiny_models import ModelSize, build_chat_tokenizer, build_model

SIZE = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=128, max_position_embeddings=128)


def _batch(tok, g=3):
    """Three prompts of different lengths (left-padded), g rollouts each with right-padded completions, rows
    shuffled as TRL shuffles a generation batch."""
    prompts = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nName a number.<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for p in prompts:
        for _ in range(g):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            rows.append((tok(p, add_special_tokens=False)["input_ids"],
                         torch.randint(5, 60, (n,), generator=gen).tolist()))
    return packed_rows(rows, tok.pad_token_id, gen)


def _logps(model, ids, mask, k):
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=k + 1).logits[:, :-1][:, -k:]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -k:, None]).squeeze(-1)


def test_distinct_prompts_maps_every_row_to_a_row_with_its_prompt():
    ids = torch.tensor([[0, 5, 6], [1, 5, 6], [7, 8, 9], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    first, inverse = distinct_prompts(ids, mask)
    assert len(first) == 2  # the pad id under the mask does not matter
    assert torch.equal(ids[first[inverse]] * mask, ids * mask) and torch.equal(mask[first[inverse]], mask)
    assert sorted(first.tolist()) == [0, 2]


@pytest.mark.parametrize("grad", [False, True])
def test_shared_prompt_pass_matches_the_full_pass(grad):
    tok = build_chat_tokenizer()
    model = build_model(tok, SIZE, seed=1).train()
    ids, mask, P, C = _batch(tok)
    with torch.set_grad_enabled(grad):
        full = _logps(model, ids, mask, C)
        shared = _logps(SharedPrefixModel(model, P), ids, mask, C)
    valid = mask[:, -C:].bool()
    torch.testing.assert_close(shared[valid], full[valid], rtol=1e-5, atol=1e-5)
    if grad:
        g_full = torch.autograd.grad(full[valid].sum(), list(model.parameters()))
        g_shared = torch.autograd.grad(shared[valid].sum(), list(model.parameters()))
        for a, b in zip(g_shared, g_full, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_rows_with_distinct_prompts_take_the_plain_path():
    tok = build_chat_tokenizer()
    model = build_model(tok, SIZE, seed=1).eval()
    ids, mask, P, C = _batch(tok, g=1)
    with torch.no_grad():
        assert torch.equal(_logps(SharedPrefixModel(model, P), ids, mask, C), _logps(model, ids, mask, C))


def test_trainer_loss_path_with_the_switch_matches_trl(tmp_path, monkeypatch):
    """SetPOTrainer's log-probs (TRL's own method, fused LM head or logits path) with and without the switch."""
    from datasets import Dataset

    import setpo.trl.shared_prefix as shared_prefix
    from setpo.trl import SetPOTrainer, config_for

    shared = []
    real = shared_prefix.distinct_prompts
    monkeypatch.setattr(shared_prefix, "distinct_prompts", lambda *a: shared.append(real(*a)) or shared[-1])

    tok = build_chat_tokenizer()
    tok.padding_side = "left"
    model = build_model(tok, SIZE, seed=1)
    ids, mask, P, C = _batch(tok)
    out = []
    for share in (False, True):
        args = config_for("grpo", output_dir=str(tmp_path / str(share)), setpo_lambda=0.0, setpo_log_diversity=False,
                          num_generations=3, per_device_train_batch_size=3, max_completion_length=8,
                          report_to=[], use_cpu=True, setpo_share_prompt_pass=share, gradient_checkpointing=False)
        trainer = SetPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                               args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 3),
                               processing_class=tok)
        trainer.model.train()  # as in the loss: a layer in training mode is where a cache can get dropped
        logps, _, *_ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, C)
        out.append(logps)
    valid = mask[:, -C:].bool()
    torch.testing.assert_close(out[1][valid], out[0][valid], rtol=1e-5, atol=1e-5)
    assert [len(first) for first, _ in shared] == [3]  # the switched run split its 9 rows into 3 prompt passes


def test_the_switch_refuses_gradient_checkpointing(tmp_path):
    """Checkpointed layers in training mode return no cache, so the shared pass would have nothing to share."""
    from setpo.trl import config_for

    with pytest.raises(ValueError, match="gradient_checkpointing=False"):
        config_for("grpo", output_dir=str(tmp_path), use_cpu=True, setpo_share_prompt_pass=True)


def test_gradients_repeat_bit_for_bit_when_many_rows_share_one_prompt():
    """Rows that share a prompt add their gradients into its one prompt pass; that sum must not depend on
    thread timing (advanced indexing's accumulating index_put_ used atomic adds on the CPU: a training run
    then differed in its last bits one time in a few)."""
    tok = build_chat_tokenizer()
    model = build_model(tok, SIZE, seed=1).train()
    ids, mask, P, C = _batch(tok, g=32)
    valid = mask[:, -C:].bool()
    grads = []
    for _ in range(8):
        logps = _logps(SharedPrefixModel(model, P), ids, mask, C)
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(logps[valid].sum(),
                                                                           list(model.parameters()))]))
    assert all(torch.equal(grads[0], g) for g in grads[1:])
