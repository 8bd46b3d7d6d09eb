"""What SetPO's kernel reads, which rollouts form the diversity sets, and a monitor for the term's exploit.

The paper (arXiv 2602.01062) embeds each complete response. When the reward reads only part of it (an
``Answer: N`` line, a boxed number), the whole-completion kernel can be satisfied by text the reward never
reads: a policy learns to append varied filler after a collapsed answer (docs/studies/short_answers.md measured
98.5% of SetPO+GRPO's samples doing so). Three options close that door, shared by the TRL and verl engines:

- **what the kernel reads** (``kernel_reads``): "completion" (the paper) or "answer", the text an *answer
  reader* returns for each completion: a user function ``reader(completion_text) -> str | None`` that gives the
  part the reward checks (for our tasks, the parsed answer; ``setpo.embed.resolve_reader`` imports one named
  "package.module:function" in a config). A row whose reader returns None or only
  whitespace has nothing to read: it is left out of its group's set and gets s = 0.
- **an answer-key kernel**: the embedder "key" (``setpo.embed.TextKeyEmbedder``) puts two rollouts at cosine 1
  when the texts it reads are equal and 0 otherwise; with ``kernel_reads="answer"`` that is "alike exactly when
  the answers are equal", outcome-based exploration's batch bonus (Song et al., arXiv 2509.06941) written as
  SetPO's marginal.
- **a correctness gate** (``gate_reward`` τ): only rollouts whose total reward is at least τ form the set and
  receive the term (DARLING's quality × diversity in SetPO's form; DSDR restricts its term to correct samples
  too): with Ω⁺ = {o_i ∈ Ω : r_i >= τ and o_i has text to read},

      s⁺_i = D(Ω⁺) − D(Ω⁺ ∖ {o_i})   for o_i ∈ Ω⁺ when |Ω⁺| >= 3,   else 0;      Â_i = Ā_i + λ · s⁺_i

  beside the paper's s_i = D(Ω) − D(Ω ∖ {o_i}) over all G rollouts (``setpo.setpo_advantages(term_rows=...)``).

  Ω⁺ holds only rows that a reward function scored: a row every reward function left unscored (None, NaN) is
  not "r_i >= τ" whatever τ is; it gets s = 0 and no base advantage (TRL's rule since 1.6), so Â = 0.

``ExploitMonitor`` watches a run for the term being paid where the reward does not look: each generation batch
it logs the correlation of s with completion length and, when an answer reader is given, the share of
completions with text after the answer; every ``window`` batches at λ > 0 it decides, at a false-alarm rate it
states (``alpha`` per signal over a whole run), whether s rises with length within groups, or the share of
completions with unread text is high and has risen while the kernel reads whole completions, and warns once
(``SetPOExploitWarning``) in plain words.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from setpo.groups import as_bool_rows, check_real, check_texts

#: ``kernel_reads`` values: the whole completion (the paper) or what the answer reader returns.
KERNEL_READS = ("completion", "answer")

#: A function completion text -> the part the reward reads (None or blank: nothing to read).
AnswerReader = Callable[[str], "str | None"]

#: Characters that may close an answer without being text of their own (``Answer: 30.``, ``\\boxed{30}``).
_CLOSING = " \t\r\n.,;:!?)]}*$\"'`"


def check_kernel_reads(kernel_reads, reader: AnswerReader | None, where: str) -> None:
    """A ValueError naming ``where`` unless ``kernel_reads`` is known and "answer" comes with a reader."""
    if kernel_reads not in KERNEL_READS:
        raise ValueError(f"{where}kernel_reads must be one of {KERNEL_READS}, got {kernel_reads!r}")
    if kernel_reads == "answer" and reader is None:
        raise ValueError(f"{where}kernel_reads='answer' needs an answer reader (a function completion text -> "
                         f"the part the reward checks, e.g. 'setpo.envs.short_answers:answer_key')")


def gate_value(tau, where: str) -> float | None:
    """The correctness gate τ as a float (None: no gate); any real number is accepted (numpy scalars included), a
    bool, a non-number or a non-finite value is a ValueError naming ``where``."""
    if tau is None:
        return None
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, numbers.Real) or not math.isfinite(float(tau)):
        raise ValueError(f"{where} must be None or a finite number (the reward a rollout needs to enter the "
                         f"diversity sets), got {tau!r}")
    return float(tau)


def read_answers(texts: Sequence[str], reader: AnswerReader) -> list[str | None]:
    """``reader`` of each text; None where it returns None or only whitespace. A reader that returns anything
    other than a string or None is a ValueError naming the row. texts must be a sequence of str (a single str
    was read letter by letter)."""
    texts = check_texts(texts)
    if not callable(reader):
        raise ValueError(f"reader must be a function completion text -> str | None, got {type(reader).__name__}")
    out = []
    for i, text in enumerate(texts):
        got = reader(text)
        if got is not None and not isinstance(got, str):
            raise ValueError(f"the answer reader returned a {type(got).__name__} for completion {i} ({got!r:.60}); "
                             f"it must return the text the reward reads, or None")
        out.append(got if got is not None and got.strip() else None)
    return out


def kernel_texts(texts: Sequence[str], kernel_reads: str, reader: AnswerReader | None
                 ) -> tuple[list[str], list[bool], list[str | None] | None]:
    """What the kernel embeds for each completion text, whether the row has anything to read, and the reader's
    answers (None without a reader). Rows with nothing to read embed "" (any embedder accepts it) and must be
    left out of the sets (``term_rows``): their embedding is never compared."""
    # an unknown kernel_reads ("Completion", "whole") used to fall through to the answer branch silently
    check_kernel_reads(kernel_reads, reader, "")
    texts = check_texts(texts)
    answers = read_answers(texts, reader) if reader is not None else None
    if kernel_reads == "completion":
        return list(texts), [True] * len(texts), answers
    if answers is None:
        raise ValueError("kernel_reads='answer' needs an answer reader")
    return [a or "" for a in answers], [a is not None for a in answers], answers


def unread_text(text: str, answer: str | None) -> str:
    """The text after the last occurrence of ``answer`` in ``text``, without closing punctuation and
    whitespace: what a reward that checks the answer never reads. "" when there is no answer (the reward read
    the completion and found none) or the answer is not found verbatim."""
    if not isinstance(text, str) or not (answer is None or isinstance(answer, str)):
        raise ValueError(f"unread_text needs text as a str and answer as a str or None, got "
                         f"{type(text).__name__} and {type(answer).__name__}")
    if answer is None:
        return ""
    at = text.rfind(answer)
    if at < 0:
        return ""  # the reader normalised the answer (e.g. "030" -> "30"): nothing located, nothing claimed
    return text[at + len(answer):].strip(_CLOSING)


class SetPOExploitWarning(UserWarning):
    """SetPO's diversity term is being paid in text the reward does not read (or in length)."""


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two (n,) float64 vectors; NaN for n < 3 or when either has no spread (logged
    only: the decision is ``length_evidence``'s)."""
    if x.numel() < 3:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 1e-12 else float("nan")


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Mid-ranks of a (n,) vector (ties share their mean rank), float64: the rows below plus the mean position
    among the tied rows."""
    below = (x.unsqueeze(0) < x.unsqueeze(1)).sum(1)
    tied = (x.unsqueeze(0) == x.unsqueeze(1)).sum(1)
    return below.double() + (tied.double() + 1) / 2


def length_evidence(s: torch.Tensor, lengths: torch.Tensor, groups: torch.Tensor) -> tuple[float, float]:
    """Within-group rank association of s with completion length: (T, Var[T] under no association).

    For each group, the centred mid-ranks a of s and b of the lengths give T_g = Σ a·b; if s does not depend on
    length, every ordering of a group's lengths is equally likely and T_g has mean 0 and variance
    Σa² · Σb² / (n_g − 1) (exactly, ties included). Summing over groups, T / sqrt(Var) is a stratified Spearman
    statistic, about standard normal with no association. Within groups because the policy is paid within them
    (Â compares a rollout with its siblings); a group with one row, or no spread in s or in length, adds nothing.
    """
    total, var = 0.0, 0.0
    for g in groups.unique():
        rows = groups == g
        if int(rows.sum()) < 2:
            continue
        a, b = _ranks(s[rows]), _ranks(lengths[rows])
        a, b = a - a.mean(), b - b.mean()
        total += float((a * b).sum())
        var += float((a * a).sum() * (b * b).sum()) / (int(rows.sum()) - 1)
    return total, var


def unread_evidence(unread: torch.Tensor, groups: torch.Tensor) -> tuple[float, float]:
    """The share of rows with unread text and the variance of that share, with each group's rows as one cluster
    (rows of one prompt are alike, so counting them as independent would understate the noise):
    v = Σ_g (y_g − p·m_g)² / (C (C − 1) m̄²) over C groups of m_g rows, y_g of them with unread text."""
    ids = groups.unique()
    y = torch.stack([unread[groups == g].double().sum() for g in ids])
    m = torch.stack([(groups == g).double().sum() for g in ids])
    p = float(y.sum() / m.sum())
    c = len(ids)
    v = float(((y - p * m) ** 2).sum() / (c * (c - 1) * m.mean() ** 2)) if c > 1 else float("inf")
    return p, v


def _normal_quantile(q: float) -> float:
    return float(torch.special.ndtri(torch.tensor(q, dtype=torch.float64)))


@dataclass
class ExploitMonitor:
    """Signals that the diversity term is paid where the reward does not look, decided with a stated false-alarm
    rate, and one warning each (``SetPOExploitWarning``).

    Batches are pooled in blocks of ``window`` generation batches with λ > 0 (batches at λ = 0, such as TRL's
    evaluation batches, pay nothing and are not counted); each full block is one decision per signal. The k-th
    decision of a signal is taken at level α_k = alpha / (k (k + 1)): since Σ_k α_k = alpha, a run of any length
    warns about a signal that is absent with probability at most ``alpha`` (1 run in 1,000 by default, per signal).

    - **length**: within each group, the rank association of s with completion length, pooled over the block's
      rows in the diversity sets (``length_evidence``); warns when T / sqrt(Var) > z(1 − α_k). Only while the
      kernel can see length: never with ``kernel_reads="answer"``, where s is a function of the answers alone.
    - **unread text** (with an answer reader, while the kernel reads whole completions): the share of
      completions with text after the answer is *high* (at least ``min_unread`` over the block) and *rising*: above
      the share of the run's first block by at least ``min_rise`` and by more than z(1 − α_k) standard errors
      (``unread_evidence``: groups as clusters). It does not need any row without filler: when every completion
      pads to the length cap (98.5% of the whole-completion arm's samples in docs/studies/short_answers.md) the
      share is still high and has still risen from where the run began. A run that starts with filler everywhere
      has no rise to see; pass ``baseline_unread`` (the base model's share, measured on its own samples) to compare
      with that instead of the first block.

    window: generation batches (at λ > 0) per decision, >= 1. alpha: the false-alarm probability of each signal over
    a whole run, in (0, 1). min_unread: the share of completions with unread text that counts as high. min_rise: the
    smallest rise of that share over the baseline that counts. baseline_unread: None (the run's first block) or the
    share to compare with.
    """

    window: int = 8
    alpha: float = 1e-3
    min_unread: float = 0.5
    min_rise: float = 0.2
    baseline_unread: float | None = None
    warned: set[str] = field(default_factory=set)
    decisions: dict[str, int] = field(default_factory=lambda: {"length": 0, "unread": 0})
    _block: list[dict] = field(default_factory=list)
    _baseline: tuple[float, float] | None = None

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, numbers.Integral) or self.window < 1:
            raise ValueError(f"ExploitMonitor.window must be an integer >= 1 (generation batches per decision), "
                             f"got {self.window!r}")
        self.window = int(self.window)
        for name, low, high in (("alpha", 0.0, 1.0), ("min_unread", 0.0, 1.0), ("min_rise", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low < float(value) < high:
                raise ValueError(f"ExploitMonitor.{name} must be a number in ({low:g}, {high:g}), got {value!r}")
            setattr(self, name, float(value))
        if self.baseline_unread is not None:
            value = self.baseline_unread
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
                raise ValueError(f"ExploitMonitor.baseline_unread must be None or a share in [0, 1], got {value!r}")
            self._baseline = (float(value), 0.0)

    def observe(self, s: torch.Tensor, lengths: Sequence[int], in_sets: Sequence[bool],
                answers: Sequence[str | None] | None, texts: Sequence[str] | None, *, lam: float,
                kernel_reads: str, groups: Sequence | None = None) -> dict[str, float]:
        """Update with one generation batch: s (N,) the raw term, lengths (N,) completion tokens, in_sets (N,)
        the rows in the diversity sets, answers (N,) the reader's answers and texts (N,) the completions
        (None without a reader), groups (N,) each row's group id (None: one group). Returns this batch's metrics
        ("setpo/s_length_corr", and with a reader "setpo/unread_fraction" and "setpo/s_unread_gap"; NaN where
        undefined), and warns once per signal when a block of ``window`` batches with λ > 0 decides so."""
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"ExploitMonitor.observe: s must be a torch tensor (N,), got {type(s).__name__}")
        # lam decides whether the batch counts: a string failed in a comparison, NaN was read as lam <= 0
        lam = check_real(lam, "ExploitMonitor.observe: lam")
        # an unknown kernel_reads was read as "answer", which turns the length signal off
        if kernel_reads not in KERNEL_READS:
            raise ValueError(f"ExploitMonitor.observe: kernel_reads must be one of {KERNEL_READS}, got {kernel_reads!r}")
        s = s.detach().double().cpu().reshape(-1)
        n = s.numel()
        length = torch.as_tensor(list(lengths), dtype=torch.float64)
        # a flag of 0.5 was cast to True: a row is in the sets or not
        rows = as_bool_rows(in_sets if isinstance(in_sets, torch.Tensor) else list(in_sets),
                            name="ExploitMonitor.observe: in_sets").cpu().reshape(-1)
        dense: dict = {}
        gid = torch.zeros(n, dtype=torch.long) if groups is None else \
            torch.as_tensor([dense.setdefault(g, len(dense)) for g in groups], dtype=torch.long)
        if not (length.numel() == rows.numel() == gid.numel() == n):
            raise ValueError(f"ExploitMonitor.observe: {n} values of s, {length.numel()} lengths, "
                             f"{rows.numel()} in_sets flags and {gid.numel()} group ids")
        metrics = {"setpo/s_length_corr": _pearson(s[rows], length[rows])}
        unread = None
        if answers is not None and texts is not None:
            texts = check_texts(texts, "ExploitMonitor.observe: texts")
            if not len(texts) == len(answers) == n:  # zip(strict=True) said only "argument 2 is shorter"
                raise ValueError(f"ExploitMonitor.observe: {n} values of s, {len(texts)} texts and {len(answers)} "
                                 f"answers; give one of each per row")
            unread = torch.tensor([bool(unread_text(t, a)) for t, a in zip(texts, answers, strict=True)],
                                  dtype=torch.bool).reshape(-1)
            with_text, without = s[rows & unread], s[rows & ~unread]
            metrics.update({
                "setpo/unread_fraction": float(unread.double().mean()) if n else float("nan"),
                "setpo/s_unread_gap": float(with_text.mean() - without.mean())
                if with_text.numel() and without.numel() else float("nan")})
        if lam > 0 and n:
            self._block.append({"s": s[rows], "length": length[rows], "gid": gid[rows], "unread": unread,
                                "all_gid": gid, "reads": kernel_reads})
            if len(self._block) == self.window:
                self._decide()
                self._block = []
        return metrics

    def _level(self, signal: str) -> float:
        """z(1 − α_k) for this signal's next decision k: α_k = alpha / (k (k + 1)), which sum to alpha."""
        self.decisions[signal] += 1
        k = self.decisions[signal]
        return _normal_quantile(1 - self.alpha / (k * (k + 1)))

    def _decide(self) -> None:
        block = self._block
        # group ids made distinct per batch: a prompt's rows in two batches are two groups
        offsets = [0]
        for b in block:
            offsets.append(offsets[-1] + int(b["all_gid"].max()) + 1)
        if all(b["reads"] == "completion" for b in block):  # the kernel cannot see length when it reads answers
            t, var = length_evidence(torch.cat([b["s"] for b in block]), torch.cat([b["length"] for b in block]),
                                     torch.cat([b["gid"] + off for b, off in zip(block, offsets)]))
            if var > 0:
                z, level = t / math.sqrt(var), self._level("length")
                if z > level:
                    self._warn("length", f"longer completions get larger diversity marginals (within-group rank "
                                         f"association z = {z:.1f} over the last {self.window} batches, above the "
                                         f"{level:.1f} that chance reaches in 1 run of {1 / self.alpha:,.0f})")
        if any(b["unread"] is None for b in block):
            return
        unread = torch.cat([b["unread"] for b in block])
        gid = torch.cat([b["all_gid"] + off for b, off in zip(block, offsets)])
        if unread.numel() == 0:
            return
        share, var = unread_evidence(unread, gid)
        if self._baseline is None:
            self._baseline = (share, var)  # the run's first block is where the share started
            return
        if not all(b["reads"] == "completion" for b in block):
            return  # a kernel that reads only the answer cannot pay for text after it
        base, base_var = self._baseline
        rise, se = share - base, math.sqrt(var + base_var)
        level = self._level("unread")
        if share >= self.min_unread and rise >= self.min_rise and (se == 0 or rise / se > level):
            self._warn("unread", f"{share:.2f} of the completions carry text after the answer, up from "
                                 f"{base:.2f} at the start (last {self.window} batches)")

    def _warn(self, signal: str, what: str) -> None:
        if signal in self.warned:
            return
        self.warned.add(signal)
        warnings.warn(
            f"SetPO's diversity term is being paid in {'length' if signal == 'length' else 'unread text'}: "
            f"{what}. If the reward reads only an answer, the policy can earn the term with text the reward "
            f"never checks. Let the kernel read the answer (kernel_reads='answer' with an answer reader, "
            f"e.g. the embedder 'key'), and/or gate the term to right answers (gate_reward).",
            SetPOExploitWarning, stacklevel=4)
