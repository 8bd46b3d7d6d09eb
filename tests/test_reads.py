"""setpo.reads and the sets the term is computed over: term_rows (the gate, rows with nothing to read) against
the term over the member rows alone, the answer-key embedder, the reader's plumbing, the exploit monitor."""

import math
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
    assert [unread_text(t, a) for t, a in zip(texts, answers, strict=True)] == ["", "days", "", ""]
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


def _observe(monitor, s, lengths, texts=None, answers=None, lam=0.5, reads="completion", groups=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = monitor.observe(torch.as_tensor(s, dtype=torch.float64), list(lengths), [True] * len(s), answers,
                                  texts, lam=lam, kernel_reads=reads, groups=groups)
    return metrics, [str(w.message) for w in caught if issubclass(w.category, SetPOExploitWarning)]


def _null_run(seed, group_size, batches=200, rows=8, reads="completion"):
    """One run of ``batches`` generation batches of ``rows`` rows in groups of ``group_size`` where nothing is paid:
    s independent of the lengths (heavy-tailed, lengths with ties and a cap), and a share of completions with text
    after the answer that does not move (prompts differ: each group has its own chance of padding)."""
    gen = torch.Generator().manual_seed(seed)
    monitor, warned = ExploitMonitor(), []
    groups = [i // group_size for i in range(rows)]
    for _ in range(batches):
        s = torch.randn(rows, generator=gen, dtype=torch.float64) ** 3
        lengths = torch.randint(1, 33, (rows,), generator=gen).clamp(max=24).tolist()
        pad_chance = torch.rand(rows // group_size, generator=gen).repeat_interleave(group_size) * 0.6
        pads = (torch.rand(rows, generator=gen) < pad_chance).tolist()
        texts = [f"Answer: 7{' and so on' if p else ''}" for p in pads]
        warned += _observe(monitor, s, lengths, texts, ["7"] * rows, reads=reads, groups=groups)[1]
    return bool(warned)


@pytest.mark.parametrize("group_size", [8, 4])
def test_monitor_false_alarm_rate_with_nothing_paid_is_at_most_one_run_in_a_hundred(group_size):
    """The documented batch size (8 rows a batch, one group of 8 or two of 4), 200 batches a run, s independent of
    length and a steady share of filler: 300 seeded runs, at most 3 warn (the monitor's design rate is 1 in 1,000
    per signal; the old run-of-3-batches rule warned in most runs)."""
    alarms = sum(_null_run(seed, group_size) for seed in range(300))
    assert alarms <= 3, f"{alarms} of 300 runs warned with nothing paid"


def test_monitor_warns_once_when_s_rises_with_length_and_says_why():
    m = ExploitMonitor(window=4)
    gen = torch.Generator().manual_seed(0)
    messages = []
    for _ in range(12):
        lengths = torch.randint(2, 20, (8,), generator=gen)
        s = lengths.double() / 20 + 0.1 * torch.randn(8, generator=gen, dtype=torch.float64)
        messages += _observe(m, s, lengths.tolist(), groups=[i // 4 for i in range(8)])[1]
    assert len(messages) == 1 and "paid in length" in messages[0] and "z = " in messages[0]
    assert "kernel_reads='answer'" in messages[0]


def test_monitor_never_warns_about_length_when_the_kernel_reads_only_the_answer_or_at_lambda_0():
    for reads, lam in (("answer", 0.5), ("completion", 0.0)):
        m = ExploitMonitor(window=2)
        for _ in range(20):
            _, warned = _observe(m, [0.1, 0.2, 0.3, 0.4], [2, 4, 6, 8], lam=lam, reads=reads)
            assert warned == []
    # λ = 0 batches (TRL's evaluation batches) are not counted toward a block
    m = ExploitMonitor(window=2)
    _observe(m, [0.1, 0.2, 0.3, 0.4], [2, 4, 6, 8], lam=0.0)
    assert m._block == [] and m.decisions == {"length": 0, "unread": 0}


def _padding_batch(share, gen, rows=8, cap=24):
    """A batch at the length cap (every length equal, so length says nothing) where ``share`` of the completions
    carry text after the answer."""
    pads = (torch.rand(rows, generator=gen) < share).tolist()
    texts = [f"Answer: {i}" + (" filler words to the cap" if p else "") for i, p in enumerate(pads)]
    return torch.randn(rows, generator=gen, dtype=torch.float64), [cap] * rows, texts, [str(i) for i in range(rows)]


def test_monitor_warns_about_unread_text_at_the_length_cap_with_no_row_left_without_it():
    """The exploit the monitor exists for: the share of completions with text after the answer goes from rare to
    all of them, all at the cap; the old monitor compared rows with and without filler and never warned here."""
    gen = torch.Generator().manual_seed(0)
    m = ExploitMonitor(window=4)
    messages = []
    for step in range(16):
        share = 0.05 if step < 4 else 1.0
        s, lengths, texts, answers = _padding_batch(share, gen)
        metrics, warned = _observe(m, s, lengths, texts, answers, groups=[i // 4 for i in range(8)])
        messages += warned
        if step >= 4:
            assert metrics["setpo/unread_fraction"] == 1.0 and math.isnan(metrics["setpo/s_unread_gap"])
    assert len(messages) == 1 and "unread text" in messages[0] and "1.00 of the completions" in messages[0]
    # the same run with a kernel that reads only the answer: nothing to pay, nothing said
    gen = torch.Generator().manual_seed(0)
    m = ExploitMonitor(window=4)
    for step in range(16):
        assert _observe(m, *_padding_batch(0.05 if step < 4 else 1.0, gen), reads="answer")[1] == []


def test_monitor_compares_with_a_given_baseline_when_the_run_starts_padded():
    gen = torch.Generator().manual_seed(1)
    started_padded, with_baseline = ExploitMonitor(window=4), ExploitMonitor(window=4, baseline_unread=0.0)
    said = {"first": [], "baseline": []}
    for _ in range(8):
        batch = _padding_batch(1.0, gen)
        said["first"] += _observe(started_padded, *batch)[1]
        said["baseline"] += _observe(with_baseline, *batch)[1]
    assert said["first"] == [] and len(said["baseline"]) == 1


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"window": -1}, {"window": 2.5}, {"window": True},
                                    {"alpha": 0.0}, {"alpha": 1.5}, {"min_unread": "high"},
                                    {"baseline_unread": 1.5}])
def test_monitor_settings_are_refused_when_built(kwargs):
    with pytest.raises(ValueError, match=f"ExploitMonitor.{next(iter(kwargs))}"):
        ExploitMonitor(**kwargs)


def test_monitor_takes_an_empty_batch_and_numpy_window():
    import numpy as np

    m = ExploitMonitor(window=np.int64(2))
    metrics, warned = _observe(m, [], [], [], [])
    assert warned == [] and math.isnan(metrics["setpo/s_length_corr"]) and math.isnan(metrics["setpo/unread_fraction"])
    assert m._block == []
    with pytest.raises(ValueError, match="4 values of s, 3 lengths"):
        _observe(m, [0.1, 0.2, 0.3, 0.4], [1, 2, 3])
