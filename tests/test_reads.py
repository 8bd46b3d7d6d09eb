"""setpo.reads and the sets the term is computed over: term_rows (the gate, rows with nothing to read) against
the term over the member rows alone, the answer-key embedder, the reader's plumbing, the exploit monitor."""

import warnings

import pytest
import torch

from setpo import diversity_marginals, setpo_advantages
from setpo.embed import TextKeyEmbedder, load_embedder, resolve_reader
from setpo.reads import ExploitMonitor, SetPOExploitWarning, check_kernel_reads, kernel_texts, unread_text


def _batch(seed=0, groups=4, g=6, d=8):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(groups * g, generator=gen), torch.randn(groups * g, d, generator=gen), g


def test_term_rows_compute_the_term_over_each_groups_members_alone():
    r, e, g = _batch()
    rows = torch.tensor([1, 1, 1, 1, 0, 0,   # 4 members
                         1, 1, 0, 0, 0, 0,   # 2 members: too few for leave-one-out, s = 0
                         1, 1, 1, 1, 1, 1,   # whole group
                         0, 1, 0, 1, 0, 1], dtype=torch.bool)  # 3 members, not contiguous
    adv, s = setpo_advantages(r, e, group_size=g, lam=0.5, term_rows=rows, return_marginals=True)
    expected = torch.zeros_like(s)
    for b in range(4):
        members = rows[b * g:(b + 1) * g].nonzero().flatten() + b * g
        if len(members) >= 3:
            expected[members] = diversity_marginals(e[members])
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-6)
    big = rows.clone()
    big[6:12] = False
    assert expected[big].abs().min() > 0  # every member of a big enough set has a term of its own
    # Ā is over the whole group, whatever the sets: Â - λ·s is GRPO's advantage
    torch.testing.assert_close(adv - 0.5 * s, setpo_advantages(r, e, group_size=g, lam=0.0), rtol=0, atol=1e-6)


def test_all_rows_as_members_is_the_paper_bit_for_bit():
    r, e, g = _batch(seed=1)
    assert torch.equal(setpo_advantages(r, e, group_size=g, lam=0.3),
                       setpo_advantages(r, e, group_size=g, lam=0.3, term_rows=torch.ones(len(r), dtype=torch.bool)))


def test_term_rows_shape_and_group_size_are_checked():
    r, e, g = _batch()
    with pytest.raises(ValueError, match="term_rows has shape"):
        setpo_advantages(r, e, group_size=g, term_rows=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least 3"):
        setpo_advantages(r[:4], e[:4], group_size=2, term_rows=torch.ones(4, dtype=torch.bool))


def test_answer_key_embedder_is_one_hot_over_stripped_texts():
    emb = load_embedder("key")
    assert isinstance(emb, TextKeyEmbedder)
    k = emb(["30", " 30 ", "31", "", "31"])
    torch.testing.assert_close(k @ k.T, torch.tensor([[1., 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 1],
                                                      [0, 0, 0, 1, 0], [0, 0, 1, 0, 1]]))
    # SetPO's marginal under it: the repeated answer earns less than the unique one
    s = diversity_marginals(emb(["7", "7", "7", "9"]))
    assert s[3] > s[0] == s[1] == s[2]
    with pytest.raises(ValueError):
        emb([1, 2, 3])


def test_kernel_texts_and_what_a_row_with_nothing_to_read_gets():
    reader = resolve_reader("setpo.envs.short_answers:answer_key")
    texts = ["Answer: 30", "Answer: 30.\n\nSo it took 30 days.", "I think 4", "answer: 031"]
    read, readable, answers = kernel_texts(texts, "answer", reader)
    assert read == ["30", "30", "", "31"] and readable == [True, True, False, True]
    assert answers == ["30", "30", None, "31"]
    read, readable, _ = kernel_texts(texts, "completion", reader)
    assert read == texts and all(readable)
    assert [unread_text(t, a) for t, a in zip(texts, answers)] == ["", "days", "", ""]
    assert unread_text("The answer is \\boxed{12}.", "12") == ""


@pytest.mark.parametrize("spec, match", [("nocolon", "package.module:function"), (3, "package.module:function"),
                                         ("a:b:c", "package.module:function"),
                                         ("no_such_module_x:f", "cannot import module"),
                                         ("setpo.envs.short_answers:missing", "has no function")])
def test_reader_specs_are_checked(spec, match):
    with pytest.raises(ValueError, match=match):
        resolve_reader(spec)


def test_kernel_reads_checks():
    check_kernel_reads("completion", None, "x.")
    with pytest.raises(ValueError, match="needs an answer reader"):
        check_kernel_reads("answer", None, "x.")
    with pytest.raises(ValueError, match="must be one of"):
        check_kernel_reads("all", None, "x.")
    with pytest.raises(ValueError, match="returned a int"):
        kernel_texts(["a"], "answer", lambda t: 3)


def _observe(monitor, s, lengths, texts=None, answers=None, lam=0.5, reads="completion"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = monitor.observe(torch.tensor(s), lengths, [True] * len(s), answers, texts, lam=lam,
                                  kernel_reads=reads)
    return metrics, [str(w.message) for w in caught if issubclass(w.category, SetPOExploitWarning)]


def test_monitor_warns_once_after_window_batches_of_length_paid_term():
    m = ExploitMonitor(window=3)
    s, lengths = [0.1, 0.2, 0.3, 0.4], [2, 4, 6, 8]
    for step in range(2):
        metrics, warned = _observe(m, s, lengths)
        assert metrics["setpo/s_length_corr"] == pytest.approx(1.0) and warned == []
    _, warned = _observe(m, s, lengths)
    assert len(warned) == 1 and "paid in length" in warned[0] and "1.00, 1.00, 1.00" in warned[0]
    assert _observe(m, s, lengths)[1] == []  # once
    # a batch without the signal breaks the run; with λ = 0 nothing is ever said
    quiet = ExploitMonitor(window=2)
    for s_b in ([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]):
        assert _observe(quiet, s_b, lengths)[1] == []
    assert _observe(ExploitMonitor(window=1), s, lengths, lam=0.0)[1] == []


def test_monitor_warns_about_unread_text_only_when_the_kernel_can_see_it():
    texts = ["Answer: 1\nblah blah", "Answer: 2\nmore words here", "Answer: 3", "Answer: 4"]
    answers = ["1", "2", "3", "4"]
    s, lengths = [0.3, 0.2, -0.1, -0.2], [5, 5, 5, 5]  # no length signal: lengths have no spread
    metrics, warned = _observe(ExploitMonitor(window=1), s, lengths, texts, answers)
    assert metrics["setpo/unread_fraction"] == 0.5 and metrics["setpo/s_unread_gap"] == pytest.approx(0.4)
    assert len(warned) == 1 and "unread text" in warned[0] and "0.50 of the completions" in warned[0]
    assert _observe(ExploitMonitor(window=1), s, lengths, texts, answers, reads="answer")[1] == []
    # unread text that earns no more than the rest is no exploit
    assert _observe(ExploitMonitor(window=1), [-0.3, -0.2, 0.1, 0.2], lengths, texts, answers)[1] == []
