"""SetPO's set diversity and its leave-one-out marginals (Li et al., "SetPO", arXiv 2602.01062).

For a rollout set Ω = {o_1..o_G} with embeddings e_i:

    k(o_i, o_j) = clamp(cos(e_i, e_j), 0, 1)                      bounded semantic kernel
    m̂(y; S)     = 1/(|S|-1) · Σ_{z∈S, z≠y} k(y, z)                 local mass, self excluded
    D(S)        = 1/|S| · Σ_{y∈S} g(m̂(y; S)),   g(x) = -log(1+x)   set diversity
    s_i         = D(Ω) - D(Ω ∖ {o_i})                              leave-one-out marginal

``kernel_marginals`` is the closed form of s_i, O(G²) per group; ``marginals_by_definition`` recomputes
D on every reduced set (O(G³)) and is the reference the tests hold the closed form to.
"""

from __future__ import annotations

from typing import Callable

import torch

from setpo.groups import Groups, as_tensor, check_finite, const, representable
from setpo.registry import lookup, registrar


def g(x: torch.Tensor) -> torch.Tensor:
    """The paper's concave transform of local mass, g(x) = -log(1 + x)."""
    return -torch.log1p(x)


#: Rows gathered per chunk when groups must be collected from a shuffled index on the CPU: the gathered block
#: stays in the cache while the matmul reads it (copying the whole input first costs more than the matmul).
_GATHER_CHUNK_BYTES = 1 << 21


def _check_layout(e: torch.Tensor, name: str) -> None:
    if e.shape[-1] == 0:
        raise ValueError(f"{name} has no features (shape {tuple(e.shape)}): the cosine needs d >= 1")
    if e.shape[-2] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(e.shape)}): there is no rollout to compare")


def _gram(e: torch.Tensor, groups: Groups | None) -> torch.Tensor:
    """Gram matrices of the groups: (B, G_max, G_max) from (N, d) rows and ``groups``, or of e's own last two
    dimensions when groups is None. Contiguous groups are a view; groups from a shuffled index are gathered
    a cache-sized chunk at a time (no padded copy of the input), padding slots repeating a real row."""
    if groups is None:
        return e @ e.transpose(-1, -2)
    b, gmax, d = groups.num_groups, groups.max_size, e.shape[-1]
    if groups.contiguous:
        x = e.reshape(b, gmax, d)
        return torch.bmm(x, x.transpose(1, 2))
    slots = groups.slots()
    per_chunk = b if e.device.type != "cpu" else max(1, _GATHER_CHUNK_BYTES // (gmax * d * e.element_size()))
    if per_chunk >= b:
        x = e.index_select(0, slots.view(-1)).view(b, gmax, d)
        return torch.bmm(x, x.transpose(1, 2))
    out = e.new_empty(b, gmax, gmax)
    buf = e.new_empty(per_chunk * gmax, d)
    for b0 in range(0, b, per_chunk):
        rows = slots[b0:b0 + per_chunk].reshape(-1)
        x = torch.index_select(e, 0, rows, out=buf[: rows.numel()]).view(-1, gmax, d)
        torch.bmm(x, x.transpose(1, 2), out=out[b0:b0 + per_chunk])
    return out


def _rescaled_rows(e: torch.Tensor, name: str) -> torch.Tensor:
    """e with each row divided by its largest absolute entry (validating it: NaN, infinities and zero rows
    are errors). The cosine is scale-free, so this changes no kernel value, and afterwards every squared norm
    lies in [1, d]: rows scaled by 1e-30 or 1e20 neither underflow to "zero-norm" nor overflow."""
    row_max = e.abs().amax(-1, keepdim=True)
    if not bool(torch.isfinite(row_max).all()):
        check_finite(e, name)
    if bool((row_max == 0).any()):
        rows = (row_max.reshape(-1) == 0).nonzero().flatten().tolist()
        raise ValueError(f"{name} has zero-norm rows (all entries 0), where the cosine is undefined (rows {rows[:10]})")
    return e / row_max


def group_kernels(e: torch.Tensor, groups: Groups | None = None, name: str = "emb") -> torch.Tensor:
    """The cosine kernel k = clamp(cos(e_i, e_j), 0, 1) of every group, validating e at no cost beyond the matmul.

    e: (N, d) rows with ``groups`` (a built ``setpo.groups.Groups``) -> (B, G_max, G_max), padding slots of
    ragged groups repeating a real row (mask them with ``groups.valid()``); or, with groups None, (..., G, d)
    -> (..., G, G). e comes from ``as_embeddings`` (float32/float64). Diagonal exactly 1.

    The input is read once, by the matmul that forms the Gram matrices. Its diagonal holds every row's squared
    norm, which a NaN or infinity in the row makes NaN or inf and a zero row makes 0; the input is scanned
    (and rescaled) only when some inverse norm 1/|e_i| lies outside ``inverse_norm_range``, i.e. when a row
    is bad or so small or large that its products under- or overflow. Then the rows are divided by their
    largest absolute entry (``_rescaled_rows``, which names a bad row) and the Gram matrices formed again, so
    any non-zero scale of a row gives the kernel of the unit row. The Gram matrix is normalised in place.
    One host read per call: the device-side answer of ``unchecked_group_kernels``.
    """
    _check_layout(e, name)
    k, ok = unchecked_group_kernels(e, groups)
    return k if bool(ok) else _rescaled_kernels(e, groups, name)


def unchecked_group_kernels(e: torch.Tensor, groups: Groups | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``group_kernels`` without its host read: (k, ok), ok a 0-d bool tensor on e's device, True when every
    inverse norm lies in ``inverse_norm_range`` and k is then ``group_kernels``' answer. When ok is False
    (a NaN, infinite or zero row, or one whose products under- or overflow), k is not the kernel: call
    ``group_kernels``, which rescales the rows or names the bad one. e's layout is the caller's to check."""
    gram = _gram(e, groups)
    inv = gram.diagonal(dim1=-2, dim2=-1).rsqrt()                # 1/|e_i|; NaN, inf or 0 for a bad row
    lo, hi = torch.aminmax(inv)
    smallest, largest = inverse_norm_range(gram.dtype)
    ok = (lo >= const(smallest, lo)).logical_and_(hi <= const(largest, hi))  # also False for NaN
    return _normalised(gram, inv), ok


def _normalised(gram: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """The kernel from Gram matrices and inverse norms: gram normalised in place, clamped, diagonal exactly 1."""
    k = gram.mul_(inv.unsqueeze(-1)).mul_(inv.unsqueeze(-2)).clamp_(0.0, 1.0)
    k.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # exactly 1, not 1 ± rounding
    return k


def _rescaled_kernels(e: torch.Tensor, groups: Groups | None, name: str) -> torch.Tensor:
    """The kernel of e's rows divided by their largest absolute entry (``_rescaled_rows``: a NaN, infinite or
    zero row is a ValueError naming it): for rows whose inverse norms lie outside ``inverse_norm_range``."""
    gram = _gram(_rescaled_rows(e, name), groups)
    return _normalised(gram, gram.diagonal(dim1=-2, dim2=-1).rsqrt())


def inverse_norm_range(dtype: torch.dtype) -> tuple[float, float]:
    """Where 1/|e| may lie for the Gram matrix of unscaled rows to be exact: squared norms in
    [tiny/eps, max/16], so that no product of two entries underflows and no sum of them overflows.
    The bounds are numbers of ``dtype`` (``representable``), so that comparing 1/|e| with them on the device
    gives the same answer as comparing the Python floats. Worked out once per dtype (a dict, which
    torch.compile reads as a constant, where it would warn about a cache wrapper)."""
    bounds = _INVERSE_NORM_RANGES.get(dtype)
    if bounds is None:
        fi = torch.finfo(dtype)
        bounds = _INVERSE_NORM_RANGES[dtype] = (representable((fi.max / 16) ** -0.5, dtype, up=True),
                                                representable((fi.tiny / fi.eps) ** -0.5, dtype, up=False))
    return bounds


_INVERSE_NORM_RANGES: dict = {}


def as_embeddings(emb, ndims=(2,), name: str = "emb") -> torch.Tensor:
    """emb as a float32/float64 tensor of an allowed rank. float16/bfloat16 (a GPU embedder's usual output)
    are upcast to float32: the marginals are differences of logs of kernel sums, which half precision
    (3 significant digits in bfloat16) would reduce to rounding noise."""
    e = as_tensor(emb, name=name)
    if e.ndim not in ndims:
        shapes = " or ".join({2: "(N, d)", 3: "(B, G, d)"}[n] for n in ndims)
        raise ValueError(f"{name} must have shape {shapes}, got {tuple(e.shape)}")
    return e


def cosine_kernel(emb) -> torch.Tensor:
    """k(o_i, o_j) = clamp(cos(e_i, e_j), 0, 1) with k(y, y) = 1.

    emb: (G, d) or (B, G, d), G >= 1, d >= 1. Returns (G, G) or (B, G, G), from one batched matmul, in
    emb's dtype (float16/bfloat16 upcast to float32). Only zero rows, NaN and infinities are errors.
    """
    return group_kernels(as_embeddings(emb, (2, 3)))


def pair_mask(valid: torch.Tensor | None, gmax: int, device=None) -> torch.Tensor:
    """Which (y, z) slots are two different real rollouts: (G, G) when every group is full (valid None),
    else (B, G, G) from the (B, G) validity mask of padded ragged groups."""
    off_diagonal = ~torch.eye(gmax, dtype=torch.bool, device=device)
    return off_diagonal if valid is None else valid[:, :, None] & valid[:, None, :] & off_diagonal


def kernel_marginals(k: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out marginals s_i = D(Ω) - D(Ω∖{o_i}) from a kernel matrix, in closed form.

    k:     (B, G, G) kernel with k(y, y) = 1 (symmetric for the paper's cosine kernel).
    valid: (B, G) bool, which slots are real rollouts when ragged groups are padded; None = all.
    Returns s: (B, G), zero in padded slots.

    With R_j = Σ_{z≠j} k_jz and n the group size, removing o_i leaves o_j (j ≠ i) with mass
    (R_j - k_ji)/(n-2), so
        D(Ω)       = 1/n     · Σ_j     g(R_j / (n-1))
        D(Ω∖{o_i}) = 1/(n-1) · Σ_{j≠i} g((R_j - k_ji) / (n-2)).
    """
    gmax = k.shape[-1]
    if valid is None:  # every group full: no mask, a handful of tensor operations (see below)
        return _full_group_marginals(k)
    keep = pair_mask(valid, gmax, k.device)
    n = valid.sum(-1, keepdim=True).to(k.dtype)

    k_off = k * keep                                             # k_jz for z ≠ j, zero elsewhere
    r = k_off.sum(-1)                                            # (B, G)     R_j
    d_full = g(r / (n - 1)).sum(-1, keepdim=True) / n              # (B, 1)     D(Ω); padded R_j = 0, g(0) = 0
    # reduced[b, i, j] = g(m̂(o_j; Ω∖{o_i})) = g((R_j - k_ji) / (n-2))
    reduced = g((r[:, None, :] - k_off.transpose(-1, -2)) / (n - 2)[:, :, None])
    d_loo = (reduced * keep).sum(-1) / (n - 1)                   # (B, G)     D(Ω∖{o_i})
    return (d_full - d_loo) * valid


def _full_group_marginals(k: torch.Tensor) -> torch.Tensor:
    """``kernel_marginals`` for B full groups of n: the same formulas, with the self term removed by
    ``R_j = Σ_z k_jz - 1`` (k_jj is exactly 1) and the i = j term of D(Ω∖{o_i}) zeroed on the diagonal,
    instead of masks. At TRL's sizes each tensor operation costs about as much as the arithmetic, hence
    in-place operations and constants made once (``const``)."""
    n = k.shape[-1]
    if n < 3:
        raise ValueError(f"leave-one-out marginals need groups of at least 3 rollouts, got {n}")
    r = k.sum(-1).sub_(const(1.0, k))                                               # (B, G)  R_j
    # -D(Ω) = 1/n · Σ_j log1p(R_j / (n-1))                                                     (B, 1)
    full = torch.log1p(r * const(1 / (n - 1), k)).sum(-1, keepdim=True).div_(const(n, k))
    # loo[b, i, j] = -g(m̂(o_j; Ω∖{o_i})) = log1p((R_j - k_ji) / (n-2)); its diagonal is not a term
    loo = torch.sub(r.unsqueeze(-2), k.transpose(-1, -2)).mul_(const(1 / (n - 2), k)).log1p_()
    loo.diagonal(dim1=-2, dim2=-1).zero_()
    return loo.sum(-1).mul_(const(1 / (n - 1), k)).sub_(full)                      # D(Ω) - D(Ω∖{o_i})


def set_diversity(emb) -> float:
    """D(Ω) of one rollout set, exactly as the paper defines it. emb: (G, d) with G >= 2."""
    e = as_embeddings(emb)
    if e.shape[0] < 2:
        raise ValueError(f"set diversity needs at least 2 rollouts (local mass excludes self), got {e.shape[0]}")
    return float(_set_diversity(group_kernels(e)))


def _set_diversity(k: torch.Tensor) -> torch.Tensor:
    """D(S) straight from the definition, for a (G, G) kernel."""
    n = k.shape[-1]
    mass = (k.sum(-1) - k.diagonal()) / (n - 1)
    return g(mass).mean()


def marginals_by_definition(emb) -> torch.Tensor:
    """s_i = D(Ω) - D(Ω∖{o_i}) with D recomputed on every reduced set: O(G³), the reference.

    emb: (G, d), one group. Used by tests and the benchmark; use ``diversity_marginals`` for real work.
    """
    e = as_embeddings(emb)
    n = e.shape[0]
    if n < 3:
        raise ValueError(f"leave-one-out marginals need groups of at least 3 rollouts, got {n}")
    k = group_kernels(e)
    full = _set_diversity(k)
    out = torch.empty(n, dtype=k.dtype, device=k.device)
    for i in range(n):
        rest = [j for j in range(n) if j != i]
        out[i] = full - _set_diversity(k[rest][:, rest])
    return out


#: The diversity terms d_i that a base advantage takes as Â_i = Ā_i + λ·d_i, by name (``register_diversity_term``).
#: Each is fn(e, groups) -> d: e (N, d) rows from ``as_embeddings``, groups a built ``Groups``, d (N,).
DiversityTerm = Callable[[torch.Tensor, Groups], torch.Tensor]
DIVERSITY_TERMS: dict[str, DiversityTerm] = {}
register_diversity_term = registrar(DIVERSITY_TERMS, "diversity term")


@register_diversity_term("setpo")
def group_marginals(e: torch.Tensor, groups: Groups) -> torch.Tensor:
    """s_i of every row: e (N, d) from ``as_embeddings``, groups of >= 3 rollouts -> (N,)."""
    return settled_term(group_marginals, e, groups, *unchecked_term(group_marginals, e, groups))


def _marginals_of_kernels(k: torch.Tensor, groups: Groups) -> torch.Tensor:
    return groups.unpad(kernel_marginals(k, groups.valid()))


@register_diversity_term("pairwise")
def group_pairwise_penalty(e: torch.Tensor, groups: Groups) -> torch.Tensor:
    """The local pairwise baseline SetPO argues against: minus each rollout's mean similarity to the rest
    of its group, -m̂(o_i; Ω) = -1/(|Ω|-1) · Σ_{z≠i} k(o_i, z).

    It rewards being far from the others on average, one pair at a time, where SetPO credits what a rollout
    adds to the diversity of the whole set. e (N, d), groups of >= 2 rollouts -> (N,) values in [-1, 0].
    """
    return settled_term(group_pairwise_penalty, e, groups, *unchecked_term(group_pairwise_penalty, e, groups))


def _pairwise_of_kernels(k: torch.Tensor, groups: Groups) -> torch.Tensor:
    valid = groups.valid()
    keep = pair_mask(valid, k.shape[-1], k.device)
    n = k.new_full((k.shape[0], 1), k.shape[-1]) if valid is None else valid.sum(-1, keepdim=True).to(k.dtype)
    return groups.unpad(-(k * keep).sum(-1) / (n - 1))


@register_diversity_term("outcome_batch")
def outcome_batch_penalty(e: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Outcome-based exploration's batch penalty (Song, Kempe & Munos 2025, "Outcome-based Exploration for LLM
    Reasoning", arXiv 2509.06941, batch exploration): for the n samples of a question,

        b_i = −(1/n) · Σ_{j≠i} 1{a_i = a_j},          Â_i = Ā_i + c · b_i   (the paper: c = 0.2)

    a penalty on final answers repeated within the group, right or wrong alike. Here 1{a_i = a_j} is the kernel
    k(o_i, o_j): with the answer-key embedder ("key") and ``kernel_reads="answer"`` it is exactly the paper's
    answer equality, and λ is c. A row whose reader finds no answer is left out of the group (n counts the rest)
    and gets 0. e (N, d), groups of >= 2 rollouts -> (N,) values in [−(n−1)/n, 0].
    """
    return settled_term(outcome_batch_penalty, e, groups, *unchecked_term(outcome_batch_penalty, e, groups))


def _outcome_batch_of_kernels(k: torch.Tensor, groups: Groups) -> torch.Tensor:
    valid = groups.valid()
    keep = pair_mask(valid, k.shape[-1], k.device)
    n = k.new_full((k.shape[0], 1), k.shape[-1]) if valid is None else valid.sum(-1, keepdim=True).to(k.dtype)
    return groups.unpad(-(k * keep).sum(-1) / n)


#: The terms computed from the groups' kernels alone: term -> (the group size it needs, what needs it, the term
#: from the kernels). Their input check can wait on the device (``unchecked_term``) and be read once per call.
_KERNEL_TERMS = {group_marginals: (3, "the leave-one-out diversity marginal", _marginals_of_kernels),
                 group_pairwise_penalty: (2, "the pairwise similarity penalty", _pairwise_of_kernels),
                 outcome_batch_penalty: (2, "outcome-based exploration's batch penalty", _outcome_batch_of_kernels)}


def unchecked_term(term: DiversityTerm, e: torch.Tensor, groups: Groups, name: str = "emb"):
    """(s, ok): the diversity term ``term`` (a value of ``DIVERSITY_TERMS``) of every row with no host read.

    ok is a 0-d bool tensor for the terms computed from the kernels (``setpo`` and ``pairwise``): False when
    some row of e is NaN, infinite, zero or so small or large that its products under- or overflow, and s is
    then not the term; ``settled_term`` reads it and recomputes s, or names the bad row. Any other term is
    computed (and checked) by itself, ok True. Group sizes and e's layout are checked here, as the term does.
    """
    spec = _KERNEL_TERMS.get(term)
    if spec is None:
        return term(e, groups), True
    minimum, what, of_kernels = spec
    groups.require_min_size(minimum, what)
    _check_layout(e, name)
    k, ok = unchecked_group_kernels(e, groups)
    return of_kernels(k, groups), ok


def settled_term(term: DiversityTerm, e: torch.Tensor, groups: Groups, s: torch.Tensor, ok, name: str = "emb"):
    """s from ``unchecked_term`` once its ok is read: s itself when ok is True, else the term of the rescaled
    rows (``group_kernels``' way) or a ValueError naming a bad row. One host read when ok is a tensor."""
    if ok is True or bool(ok):
        return s
    return _KERNEL_TERMS[term][2](_rescaled_kernels(e, groups, name), groups)


def dra_rewards(rewards, emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """DRA-GRPO's diversity-aware reward adjustment, the closest prior art to SetPO (Chen et al. 2025,
    "DRA-GRPO", arXiv 2505.09655): each reward divided by one plus its graph-cut submodular mutual
    information with the rest of its group,

        r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)),

    then fed to a base estimator in place of r (``setpo.advantages.dra_advantages``). A redundant response
    (many near copies) keeps little of its reward, a unique one all of it. It rescales rewards, where SetPO
    adds a set-level marginal; a group of wrong answers (r = 0) gets no signal from it.

    k is SetPO's kernel (cosine clamped to [0, 1]; DRA's paper writes the plain cosine): both methods then see
    the same similarities, and the denominator stays >= 1. Inputs as in ``diversity_term``, rewards (N,).
    Returns r̃ (N,) in the wider float dtype of rewards and embeddings.
    """
    return group_dra_rewards(*rewards_and_embeddings(rewards, emb, index, group_size))


def rewards_and_embeddings(rewards, emb, index=None, group_size: int | None = None, *, check: bool = True):
    """(r (N,) finite rewards on emb's device, e (N, d) from ``as_embeddings``, their ``Groups``), checked
    (``check`` False: the rewards' NaN and infinities are left for the caller to find, with no host read)."""
    e = as_embeddings(emb)
    r = as_tensor(rewards, name="rewards", device=e.device)
    if r.ndim != 1 or r.shape[0] != e.shape[0]:
        raise ValueError(f"rewards has shape {tuple(r.shape)} but emb has {e.shape[0]} rows; expected ({e.shape[0]},)")
    if check:
        check_finite(r, "rewards")
    return r, e, Groups.build(e.shape[0], index, group_size, device=e.device)


def group_dra_rewards(r: torch.Tensor, e: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``dra_rewards`` over built groups of >= 2: r (N,), e (N, d) -> r̃ (N,)."""
    groups.require_min_size(2, "DRA's reward adjustment")
    return _dra_of_penalty(r, group_pairwise_penalty(e, groups), groups)


def unchecked_group_dra_rewards(r: torch.Tensor, e: torch.Tensor, groups: Groups):
    """(r̃, ok): ``group_dra_rewards`` with the embeddings' check left on the device (``unchecked_term``)."""
    groups.require_min_size(2, "DRA's reward adjustment")
    penalty, ok = unchecked_term(group_pairwise_penalty, e, groups)
    return _dra_of_penalty(r, penalty, groups), ok


def _dra_of_penalty(r: torch.Tensor, penalty: torch.Tensor, groups: Groups) -> torch.Tensor:
    similarity_to_rest = -penalty * (groups.sizes[groups.group_id] - 1)  # Σ_{j≠i} k_ij
    dtype = torch.promote_types(r.dtype, similarity_to_rest.dtype)
    return r.to(dtype) / (1 + similarity_to_rest.to(dtype))


def diversity_term(name: str, emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """The diversity term ``name`` (a key of ``DIVERSITY_TERMS``) for every row.

    emb: (N, d) response embeddings (torch or numpy; float32 or float64 kept, float16/bfloat16 upcast to
        float32, on any device). Any non-zero scale of a row is fine: the cosine ignores it.
    index: (N,) group id of each row, verl style: any hashable ids, any order, unequal group sizes.
    group_size: rows form N / group_size contiguous groups. With neither, all rows are one group.
    Returns (N,) on emb's device.
    """
    term = lookup(DIVERSITY_TERMS, name, "diversity term")
    e = as_embeddings(emb)
    return term(e, Groups.build(e.shape[0], index, group_size, device=e.device))


def diversity_marginals(emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """SetPO's leave-one-out diversity marginal s_i for every row (inputs as in ``diversity_term``); every
    group needs at least 3 rollouts. Returns s: (N,) on emb's device."""
    return diversity_term("setpo", emb, index, group_size=group_size)


def pairwise_similarity_penalty(emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """-m̂(o_i; Ω) for every row (see ``group_pairwise_penalty``; inputs as in ``diversity_term``); groups
    need at least 2 rollouts. Returns (N,) values in [-1, 0]."""
    return diversity_term("pairwise", emb, index, group_size=group_size)
