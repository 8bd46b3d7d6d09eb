"""Embedders: shapes, per-call deduplication, determinism, offline default model, clear errors."""

import numpy as np
import pytest
import torch

from setpo import diversity_marginals
from setpo.embed import (
    DedupEmbedder,
    Embedder,
    HashedNgramEmbedder,
    SentenceTransformerEmbedder,
    TableEmbedder,
    default_embedder,
    load_embedder,
)


class CountingEmbedder(DedupEmbedder):
    """Records what reaches the model, to check deduplication and batching."""

    def __init__(self, batch_size=2):
        self.dim, self.batch_size, self.seen = 3, batch_size, []

    def _embed_unique(self, texts):
        self.seen.append(list(texts))
        return torch.tensor([[len(t), 1.0, t.count("a")] for t in texts])


def test_dedup_embeds_each_text_once_and_keeps_row_order():
    e = CountingEmbedder(batch_size=2)
    texts = ["aa", "b", "aa", "ccc", "b", "aa"]
    out = e(texts)
    assert out.shape == (6, 3) and out.dtype == torch.float32
    assert [t for batch in e.seen for t in batch] == ["aa", "b", "ccc"]  # each once, first-seen order
    assert all(len(batch) <= 2 for batch in e.seen)
    assert torch.equal(out[:, 0], torch.tensor([2.0, 1, 2, 3, 1, 2]))
    assert torch.equal(out[0], out[2]) and torch.equal(out[1], out[4])


def test_empty_input_and_bad_input():
    e = HashedNgramEmbedder(dim=32)
    assert e([]).shape == (0, 32)
    with pytest.raises(ValueError, match="single str"):
        e("abc")
    with pytest.raises(ValueError, match="must all be str"):
        e(["a", 3])


def test_hashed_embedder_deterministic_unit_norm_and_similarity_ordered():
    e = HashedNgramEmbedder(dim=128)
    a = e(["(3+4)*5", "(3+4)*5 ", "98-12/4", ""])
    b = HashedNgramEmbedder(dim=128)(["(3+4)*5"])
    assert isinstance(e, Embedder)
    assert torch.equal(a[0], b[0])  # no per-process hash salt
    assert torch.allclose(a.norm(dim=1), torch.ones(4))
    assert a[0] @ a[1] > a[0] @ a[2]  # near-identical strings are closer than unrelated ones
    # feeds SetPO directly: finite marginals, the odd one out gets the highest credit
    s = diversity_marginals(e(["(3+4)*5", "(3+4)*5 ", "(4+3)*5", "98-12/4"]))
    assert torch.isfinite(s).all() and int(s.argmax()) == 3


def test_table_embedder():
    t = TableEmbedder({"m0": [1.0, 0.0], "m1": [0.0, 1.0], "m2": np.array([1.0, 1.0])})
    out = t(["m1", "m0", "m1", "m2"])
    assert torch.equal(out, torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="no vector"):
        t(["m9"])


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="local path only"):
        SentenceTransformerEmbedder(tmp_path / "Qwen3-Embedding-0.6B")
    with pytest.raises(FileNotFoundError):
        load_embedder(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="integer"):
        load_embedder("hash:x")


def test_load_embedder_specs():
    h = load_embedder("hash:64")
    assert isinstance(h, HashedNgramEmbedder) and h.dim == 64
    assert load_embedder(h) is h
    with pytest.raises(ValueError):
        load_embedder(None)


def test_default_embedder_offline_minilm():
    e = default_embedder()
    texts = ["(25-5)*4", "4*(25-5)", "the cat sat on the mat", "(25-5)*4"]
    out = e(texts)
    assert out.shape == (4, 384) and out.dtype == torch.float32
    assert torch.allclose(out.norm(dim=1), torch.ones(4), atol=1e-4)
    assert torch.equal(out[0], out[3])
    sim = out @ out.T
    assert sim[0, 1] > sim[0, 2]  # the same expression reordered is closer than prose
    assert load_embedder("default") is e  # cached: loading takes seconds


def test_centered_embedder_removes_the_common_direction():
    from setpo.embed import CenteredEmbedder

    base = TableEmbedder({"a": [10.0, 1.0, 0.0], "b": [10.0, 0.0, 1.0], "c": [10.0, -1.0, 0.0]})
    raw = base(["a", "b"])
    assert float(raw[0] @ raw[1] / (raw[0].norm() * raw[1].norm())) > 0.98  # nearly parallel before
    c = CenteredEmbedder(base, ["a", "b", "c", "a"])  # duplicates in the reference count once
    assert torch.allclose(c.mean, torch.tensor([10.0, 0.0, 1 / 3]))
    out = c(["a", "b"])
    assert torch.allclose(out, raw - c.mean)
    assert float(out[0] @ out[1]) < 0  # now clearly apart: the kernel clamps this pair to 0
    with pytest.raises(ValueError, match="empty"):
        CenteredEmbedder(base, [])


def test_named_specs_resolve_without_a_path():
    from setpo.embed import SentenceTransformerEmbedder, is_named_embedder, load_embedder

    assert all(is_named_embedder(s) for s in ("default", "minilm", "all-MiniLM-L6-v2", "hash", "hash:64"))
    assert not is_named_embedder("/models/Qwen3-Embedding-0.6B")
    short = load_embedder("minilm", max_seq_length=16)
    assert isinstance(short, SentenceTransformerEmbedder) and short.model.max_seq_length == 16
    assert short(["a b c"]).shape == (1, 384)


def test_solution_key_embedder_is_the_exact_verifier_kernel(monkeypatch):
    from setpo.diversity import cosine_kernel
    from setpo.embed import SolutionKeyEmbedder

    e = SolutionKeyEmbedder(lambda prompt, completion: (prompt, completion.strip()))
    assert e.uses_prompts is True
    texts = ["(3+4)*5", "(3+4)*5 ", "98-12/4", "(3+4)*5", "x"]
    prompts = ["p", "p", "p", "q", "q"]  # the same text under another prompt is another solution
    out = e(texts, prompts=prompts)
    assert out.shape == (5, 4) and out.dtype == torch.float32
    k = cosine_kernel(out)
    same = torch.tensor([[(prompts[i], texts[i].strip()) == (prompts[j], texts[j].strip()) for j in range(5)]
                         for i in range(5)])
    assert torch.equal(k, same.float())  # exactly 1 for the same key, exactly 0 otherwise
    s = diversity_marginals(e(["a", "a", "b"], prompts=["p"] * 3))
    assert s[2] > s[0] == s[1]
    assert e([], prompts=[]).shape[0] == 0
    with pytest.raises(ValueError, match="needs the prompts"):
        e(texts)
    with pytest.raises(ValueError, match="one prompt per text"):
        e(texts, prompts=prompts[:2])
    with pytest.raises(ValueError, match="unhashable"):
        SolutionKeyEmbedder(lambda p, c: [c])(["a"], prompts=["p"])
    with pytest.raises(ValueError, match="callable"):
        SolutionKeyEmbedder("canonical")
    # refused across processes: each process's one-hot columns would mean different keys
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="world size 2"):
        e(texts, prompts=prompts)
