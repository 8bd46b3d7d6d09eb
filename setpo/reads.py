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

``ExploitMonitor`` watches a run for the term being paid where the reward does not look: each generation batch
it logs the correlation of s with completion length and, when an answer reader is given, the share of
completions with text after the answer, and warns once (``SetPOExploitWarning``) in plain words when either
has held for ``window`` batches in a row.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

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


def read_answers(texts: Sequence[str], reader: AnswerReader) -> list[str | None]:
    """``reader`` of each text; None where it returns None or only whitespace. A reader that returns anything
    other than a string or None is a ValueError naming the row."""
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
    if answer is None:
        return ""
    at = text.rfind(answer)
    if at < 0:
        return ""  # the reader normalised the answer (e.g. "030" -> "30"): nothing located, nothing claimed
    return text[at + len(answer):].strip(_CLOSING)


class SetPOExploitWarning(UserWarning):
    """SetPO's diversity term is being paid in text the reward does not read (or in length)."""


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two (n,) float64 vectors; NaN for n < 3 or when either has no spread."""
    if x.numel() < 3:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 1e-12 else float("nan")


@dataclass
class ExploitMonitor:
    """Per-batch signals that the diversity term is paid where the reward does not look, and one warning each.

    window: batches in a row a signal must hold before the warning. min_corr: the correlation of s with
    completion length (over rows in the sets) that counts as "paid in length". min_unread: the share of
    completions with text after the answer that counts as "paid in unread text", when the rows carrying such
    text also get the larger s on average and the kernel reads whole completions (a kernel that reads only the
    answer cannot pay for text after it). A signal that is NaN (too few rows) breaks the run of batches.
    """

    window: int = 3
    min_corr: float = 0.3
    min_unread: float = 0.25
    warned: set[str] = field(default_factory=set)
    _runs: dict[str, list[float]] = field(default_factory=lambda: {"length": [], "unread": []})

    def observe(self, s: torch.Tensor, lengths: Sequence[int], in_sets: Sequence[bool],
                answers: Sequence[str | None] | None, texts: Sequence[str] | None, *, lam: float,
                kernel_reads: str) -> dict[str, float]:
        """Update with one generation batch: s (N,) the raw term, lengths (N,) completion tokens, in_sets (N,)
        the rows in the diversity sets, answers (N,) the reader's answers and texts (N,) the completions
        (None without a reader). Returns the metrics to log ("setpo/s_length_corr", and with a reader
        "setpo/unread_fraction" and "setpo/s_unread_gap"); warns once per signal when λ > 0."""
        s = s.detach().double().cpu()
        rows = torch.as_tensor(list(in_sets), dtype=torch.bool)
        corr = _pearson(s[rows], torch.as_tensor(list(lengths), dtype=torch.float64)[rows])
        metrics = {"setpo/s_length_corr": corr}
        self._extend("length", corr if corr >= self.min_corr else None)
        if answers is not None and texts is not None:
            unread = torch.tensor([bool(unread_text(t, a)) for t, a in zip(texts, answers, strict=True)])
            fraction = float(unread.double().mean()) if unread.numel() else float("nan")
            with_text, without = s[rows & unread], s[rows & ~unread]
            gap = float(with_text.mean() - without.mean()) if with_text.numel() and without.numel() else float("nan")
            metrics.update({"setpo/unread_fraction": fraction, "setpo/s_unread_gap": gap})
            paid = kernel_reads == "completion" and fraction >= self.min_unread and gap > 0
            self._extend("unread", fraction if paid else None)
        if lam > 0:
            self._warn()
        return metrics

    def _extend(self, signal: str, value: float | None) -> None:
        run = self._runs[signal]
        if value is None or not math.isfinite(value):
            run.clear()
        else:
            run.append(value)

    def _warn(self) -> None:
        for signal, run in self._runs.items():
            if len(run) < self.window or signal in self.warned:
                continue
            self.warned.add(signal)
            last = ", ".join(f"{v:.2f}" for v in run[-self.window:])
            if signal == "length":
                what = (f"longer completions get larger diversity marginals (correlation of s with completion "
                        f"length {last} over the last {self.window} batches)")
            else:
                what = (f"{last} of the completions carry text after the answer, and those get the larger "
                        f"diversity marginals (last {self.window} batches)")
            warnings.warn(
                f"SetPO's diversity term is being paid in {signal if signal == 'length' else 'unread text'}: "
                f"{what}. If the reward reads only an answer, the policy can earn the term with text the reward "
                f"never checks. Let the kernel read the answer (kernel_reads='answer' with an answer reader, "
                f"e.g. the embedder 'key'), and/or gate the term to right answers (gate_reward).",
                SetPOExploitWarning, stacklevel=3)
