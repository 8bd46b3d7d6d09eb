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

import torch

from setpo.groups import Groups, as_tensor, check_finite


def g(x: torch.Tensor) -> torch.Tensor:
    """The paper's concave transform of local mass, g(x) = -log(1 + x)."""
    return -torch.log1p(x)


def _cosine_kernel(e: torch.Tensor, name: str = "emb") -> torch.Tensor:
    """Kernel of (..., G, d) embeddings, validating them on the way at O(G·d) cost.

    The cosine is scale-free, so each row is first divided by its largest absolute entry: rows scaled by
    1e-30 or 1e20 give the same kernel as unit rows instead of underflowing to "zero-norm" or overflowing
    their squared norm (after the division every squared norm lies in [1, d]). That division also validates:
    a NaN or infinity makes its row's max NaN or inf, and only truly zero rows have max 0. Then one matmul
    forms the Gram matrix, normalised by its own diagonal.
    """
    if e.shape[-1] == 0:
        raise ValueError(f"{name} has no features (shape {tuple(e.shape)}): the cosine needs d >= 1")
    if e.shape[-2] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(e.shape)}): there is no rollout to compare")
    row_max = e.abs().amax(-1, keepdim=True)                     # (..., G, 1)
    if not bool(torch.isfinite(row_max).all()):
        check_finite(e, name)
    if bool((row_max == 0).any()):
        rows = (row_max.reshape(-1) == 0).nonzero().flatten().tolist()
        raise ValueError(f"{name} has zero-norm rows (all entries 0), where the cosine is undefined (rows {rows[:10]})")
    u = e / row_max
    gram = u @ u.transpose(-1, -2)
    inv = gram.diagonal(dim1=-2, dim2=-1).rsqrt()
    k = (gram * inv[..., :, None] * inv[..., None, :]).clamp_(0.0, 1.0)
    k.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # exactly 1, not 1 ± rounding
    return k


def _as_embeddings(emb, ndims=(2,), name: str = "emb") -> torch.Tensor:
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
    return _cosine_kernel(_as_embeddings(emb, (2, 3)))


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
    b, gmax, _ = k.shape
    keep = pair_mask(valid, gmax, k.device)
    n = k.new_full((b, 1), gmax) if valid is None else valid.sum(-1, keepdim=True).to(k.dtype)

    k_off = k * keep                                             # k_jz for z ≠ j, zero elsewhere
    r = k_off.sum(-1)                                            # (B, G)     R_j
    d_full = g(r / (n - 1)).sum(-1, keepdim=True) / n              # (B, 1)     D(Ω); padded R_j = 0, g(0) = 0
    # reduced[b, i, j] = g(m̂(o_j; Ω∖{o_i})) = g((R_j - k_ji) / (n-2))
    reduced = g((r[:, None, :] - k_off.transpose(-1, -2)) / (n - 2)[:, :, None])
    d_loo = (reduced * keep).sum(-1) / (n - 1)                   # (B, G)     D(Ω∖{o_i})
    s = d_full - d_loo
    return s if valid is None else s * valid


def set_diversity(emb) -> float:
    """D(Ω) of one rollout set, exactly as the paper defines it. emb: (G, d) with G >= 2."""
    e = _as_embeddings(emb)
    if e.shape[0] < 2:
        raise ValueError(f"set diversity needs at least 2 rollouts (local mass excludes self), got {e.shape[0]}")
    return float(_set_diversity(_cosine_kernel(e)))


def _set_diversity(k: torch.Tensor) -> torch.Tensor:
    """D(S) straight from the definition, for a (G, G) kernel."""
    n = k.shape[-1]
    mass = (k.sum(-1) - k.diagonal()) / (n - 1)
    return g(mass).mean()


def marginals_by_definition(emb) -> torch.Tensor:
    """s_i = D(Ω) - D(Ω∖{o_i}) with D recomputed on every reduced set: O(G³), the reference.

    emb: (G, d), one group. Used by tests and the benchmark; use ``diversity_marginals`` for real work.
    """
    e = _as_embeddings(emb)
    n = e.shape[0]
    if n < 3:
        raise ValueError(f"leave-one-out marginals need groups of at least 3 rollouts, got {n}")
    k = _cosine_kernel(e)
    full = _set_diversity(k)
    out = torch.empty(n, dtype=k.dtype, device=k.device)
    for i in range(n):
        rest = [j for j in range(n) if j != i]
        out[i] = full - _set_diversity(k[rest][:, rest])
    return out


def diversity_marginals(emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """SetPO's leave-one-out diversity marginal s_i for every row.

    emb: (N, d) response embeddings (torch or numpy; float32 or float64 kept, float16/bfloat16 upcast to
        float32, on any device). Any non-zero scale of a row is fine: the cosine ignores it.
    index: (N,) group id of each row, verl style: any hashable ids, any order, unequal group sizes.
    group_size: rows form N / group_size contiguous groups. With neither, all rows are one group.
    Returns s: (N,) tensor on emb's device. Every group needs at least 3 rollouts.
    """
    e = _as_embeddings(emb)
    groups = Groups.build(e.shape[0], index, group_size, device=e.device)
    groups.require_min_size(3, "the leave-one-out diversity marginal")
    # Padded slots are filled with 1.0 so their norm is not zero; kernel_marginals masks them out.
    k = _cosine_kernel(groups.pad(e, fill=1.0))
    return groups.unpad(kernel_marginals(k, groups.valid()))


def pairwise_similarity_penalty(emb, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """The local pairwise baseline SetPO argues against: minus each rollout's mean similarity to the rest
    of its group, -m̂(o_i; Ω) = -1/(|Ω|-1) · Σ_{z≠i} k(o_i, z).

    It rewards being far from the others on average, one pair at a time, where SetPO credits what a rollout
    adds to the diversity of the whole set. Same inputs and shapes as ``diversity_marginals``; groups need at
    least 2 rollouts. Returns (N,) values in [-1, 0].
    """
    e = _as_embeddings(emb)
    groups = Groups.build(e.shape[0], index, group_size, device=e.device)
    groups.require_min_size(2, "the pairwise similarity penalty")
    k = _cosine_kernel(groups.pad(e, fill=1.0))
    valid = groups.valid()
    keep = pair_mask(valid, k.shape[-1], k.device)
    n = k.new_full((k.shape[0], 1), k.shape[-1]) if valid is None else valid.sum(-1, keepdim=True).to(k.dtype)
    return groups.unpad(-(k * keep).sum(-1) / (n - 1))


#: Diversity terms d_i that can be added to a base advantage as Ā_i + λ·d_i, by name: SetPO's leave-one-out
#: marginal, and the local pairwise penalty it is compared with. Each is fn(emb, index, group_size=) -> (N,).
DIVERSITY_TERMS = {"setpo": diversity_marginals, "pairwise": pairwise_similarity_penalty}
