"""Does the kernel see the difference? Diagnostics for choosing an embedder before training with SetPO.

SetPO's credit s_i is only as informative as the kernel k = clamp(cos(e_i, e_j), 0, 1): if an embedder puts
every response of a task at cosine 0.9, the marginals of a collapsed group and of a diverse one barely differ
and λ·s is lost next to the base advantage. Given responses whose *solution identity* is known (e.g. the
canonical form of a Countdown expression), these functions measure

- how far apart the kernel puts two responses of the same solution and two of different solutions
  (means, 5th percentiles, and the AUC: the probability that a same-solution pair is more similar than a
  different-solution pair; 0.5 = the kernel cannot tell, 1.0 = it always can);
- the scale of s in a *collapsed* group: ``copies`` copies of one solution next to ``others`` distinct ones.
  The spread max(s) - min(s) is the size of the push SetPO can give there, to compare with the base
  advantages (±1 for GRPO in a mixed group).

Shapes: N rows in groups given by a verl-style ``index`` or a contiguous ``group_size``, as everywhere in setpo.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass

import torch

from setpo.diversity import as_embeddings, diversity_marginals, group_kernels, pair_mask
from setpo.groups import Groups


@dataclass(frozen=True)
class KernelSeparation:
    """Kernel values of within-group pairs, split by whether the two rows are the same solution."""

    same_mean: float        # mean k over pairs of the same solution (nan when there are none)
    same_p5: float          # its 5th percentile
    different_mean: float   # mean k over pairs of different solutions
    different_p5: float     # its 5th percentile
    auc: float              # P(k_same > k_different) + P(tie)/2 over all such pairs of pairs
    n_same: int
    n_different: int

    def as_row(self) -> dict:
        return asdict(self)


def _quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.double(), q)) if x.numel() else float("nan")


def separation_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Mann-Whitney AUC P(pos > neg) + P(pos = neg)/2 of two 1-D samples, from average ranks (ties share their
    rank); NaN when either is empty."""
    if not pos.numel() or not neg.numel():
        return float("nan")
    values = torch.cat([pos, neg]).double()
    order = values.argsort()
    sorted_values = values[order]
    _, counts = torch.unique_consecutive(sorted_values, return_counts=True)
    ends = counts.cumsum(0).double()
    average_rank = (ends - (counts.double() - 1) / 2).repeat_interleave(counts)   # 1-based, ties averaged
    ranks = torch.empty_like(values)
    ranks[order] = average_rank
    n_pos, n_neg = pos.numel(), neg.numel()
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def kernel_separation(emb, solution_ids: Sequence[Hashable], index=None, *,
                      group_size: int | None = None) -> KernelSeparation:
    """Same-solution vs different-solution kernel values over every within-group pair.

    emb: (N, d) response embeddings. solution_ids: (N,) hashable identity of each row's solution (equal ids
    = the same solution). Groups (e.g. one per problem) by ``index`` or ``group_size``; pairs never cross
    groups, because SetPO's kernel never compares responses to different prompts.
    """
    e = as_embeddings(emb)
    ids = list(solution_ids)
    if len(ids) != e.shape[0]:
        raise ValueError(f"solution_ids has {len(ids)} entries for {e.shape[0]} embedding rows")
    codes = {}
    labels = torch.tensor([codes.setdefault(s, len(codes)) for s in ids], device=e.device)
    groups = Groups.build(e.shape[0], index, group_size, device=e.device)
    k = group_kernels(e, groups)                                                         # (B, G, G)
    lab = groups.pad(labels[:, None].float(), fill=-1.0)[..., 0]                   # (B, G)
    pairs = pair_mask(groups.valid(), k.shape[-1], e.device).triu(1)               # each pair once
    same = (lab[:, :, None] == lab[:, None, :]) & pairs
    different = ~(lab[:, :, None] == lab[:, None, :]) & pairs
    k_same, k_diff = k[same], k[different]
    mean = lambda x: float(x.double().mean()) if x.numel() else float("nan")  # noqa: E731
    return KernelSeparation(mean(k_same), _quantile(k_same, 0.05), mean(k_diff), _quantile(k_diff, 0.05),
                            separation_auc(k_same, k_diff), int(k_same.numel()), int(k_diff.numel()))


def collapsed_group_marginals(distinct_emb, copies: int = 4, others: int = 3) -> torch.Tensor:
    """s of a collapsed group: ``copies`` rows of solution 0, then solutions 1..``others`` once each.

    distinct_emb: (M, d) embeddings of M >= others + 1 distinct solutions of one problem (row 0 is the one
    the group collapsed onto). Returns s: (copies + others,). ``s.max() - s.min()`` is the spread SetPO
    can add between a duplicated and a unique response in such a group.
    """
    e = as_embeddings(distinct_emb, name="distinct_emb")
    if copies < 1 or others < 1 or copies + others < 3:
        raise ValueError(f"a collapsed group needs copies >= 1, others >= 1 and at least 3 rows; got "
                         f"copies={copies}, others={others}")
    if e.shape[0] < others + 1:
        raise ValueError(f"need at least {others + 1} distinct solutions, got {e.shape[0]}")
    group = torch.cat([e[:1].expand(copies, -1), e[1:others + 1]])
    return diversity_marginals(group)


def diagnose_embedder(embedder: Callable[[list[str]], torch.Tensor],
                      problems: Sequence[Sequence[tuple[str, Hashable]]], *, copies: int = 4,
                      others: int = 3) -> dict:
    """Everything above for one embedder, over problems given as (response text, solution id) lists.

    Each problem's responses form one group for ``kernel_separation``; its first response of each distinct
    solution feeds ``collapsed_group_marginals`` (problems with fewer than others + 1 distinct solutions are
    skipped there). Returns the separation fields plus ``collapsed_spread`` (mean over problems of
    max(s) - min(s)), ``unique_minus_copy`` (mean s of a unique response minus that of a copy) and
    ``n_collapsed`` (problems used).
    """
    texts, ids, index = [], [], []
    for p, responses in enumerate(problems):
        for text, sid in responses:
            texts.append(text)
            ids.append((p, sid))
            index.append(p)
    if not texts:
        raise ValueError("no responses to diagnose")
    emb = torch.as_tensor(embedder(texts)).float()
    row = kernel_separation(emb, ids, index).as_row()
    spreads, gaps = [], []
    start = 0
    for responses in problems:
        first = {}
        for j, (_, sid) in enumerate(responses):
            first.setdefault(sid, start + j)
        start += len(responses)
        if len(first) >= others + 1:
            s = collapsed_group_marginals(emb[list(first.values())], copies, others)
            spreads.append(float(s.max() - s.min()))
            gaps.append(float(s[copies:].mean() - s[:copies].mean()))
    row.update(collapsed_spread=sum(spreads) / len(spreads) if spreads else float("nan"),
               unique_minus_copy=sum(gaps) / len(gaps) if gaps else float("nan"), n_collapsed=len(spreads))
    return row
