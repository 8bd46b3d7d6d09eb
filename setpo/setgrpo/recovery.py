"""SetGRPO module (b): geometry-guided safe recovery, and the per-response gradient features it uses.

See ``setpo.setgrpo`` for the method and which parts are this package's design."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from setpo.groups import Groups, as_bool_rows, as_tensor, check_finite, check_int, check_real
from setpo.setgrpo.inputs import check_bisect, check_feature_dims


def gram_matrices(features, groups: Groups) -> torch.Tensor:
    """(B, G_max, G_max) float64 Gram K_ij = ⟨g_i, g_j⟩ per group; None features → identity.

    The product runs in the features' own dtype (float32 features stay float32: the (N, d) input is read
    once, by the matmul) and only the small Gram is promoted to float64. A NaN or infinity in a row reaches
    that row's Gram entries, so checking the Gram is enough; only then is the input scanned to name it.
    Padded slots are zero rows and columns, so they drop out of every product.
    """
    if features is None:
        eye = torch.eye(groups.max_size, dtype=torch.float64, device=groups.sizes.device)
        k = eye.expand(groups.num_groups, -1, -1).clone()
        valid = groups.valid()
        return k if valid is None else k * valid[:, :, None] * valid[:, None, :]
    f = groups.pad(features, fill=0.0)
    k = (f @ f.transpose(-1, -2)).to(torch.float64)
    if not bool(torch.isfinite(k).all()):
        check_finite(features, "features")
        raise ValueError(f"features are too large: their inner products overflow {features.dtype}")
    return k


@dataclass
class Recovery:
    """Safe recovery of a batch of groups (B groups, G_max slots, T thresholds).

    tau:      (T,) thresholds τ (box inflations) the recovery was solved for.
    anchor:   (B, T, G) c₀(τ), â soft-thresholded by τq̂σ̂ (the point of the box C(τ) nearest 0).
    eta:      (B, T) η*(τ), the largest η ∈ [0, 1] with m_τ(η) ≥ 0 (NaN when none exists).
    m_at_eta: (B, T) m_τ(η*) (≥ 0 where eta is finite).
    accepted: (B, T) bool, the safe update c(η*(τ)) exists and moves the policy (‖Σ c_i g_i‖ is not zero
              to rounding, relative to its bound ‖c‖₂ · sqrt(tr K)).
    coef:     (B, T, G) c(η*(τ)) for accepted groups, zero for rejected ones.
    rho:      (B,) gate score, the largest τ ≤ rho_max at which the group is accepted (bisection over τ;
              −inf when it is not accepted even at τ = 0, i.e. â moves nothing), or None if not computed.
    """

    tau: torch.Tensor
    anchor: torch.Tensor
    eta: torch.Tensor
    m_at_eta: torch.Tensor
    accepted: torch.Tensor
    coef: torch.Tensor
    rho: torch.Tensor | None = None


#: Most numbers in one feature matrix or random projection ``lm_head_gradient_features`` builds (1 GiB float32).
_MAX_FEATURE_ENTRIES = 1 << 28


class _Path:
    """Recovery paths c(η) = c₀(τ) + η(â − c₀(τ)) of B groups at T thresholds each.

    centre, sigma: (B, G); gram: (B, G, G); tau: (B, T). Ratios are evaluated at (B, T, P).
    """

    def __init__(self, centre, sigma, q, gram, tau):
        self.centre, self.box = centre[:, None, :], tau[..., None] * q * sigma[:, None, :]   # (B,1,G), (B,T,G)
        self.anchor = self.centre.sign() * (self.centre.abs() - self.box).clamp_min(0.0)     # (B, T, G)
        self.d = self.centre - self.anchor
        mv = lambda x: (gram[:, None] @ x[..., None])[..., 0]  # noqa: E731  (B, T, G) -> (B, T, G)
        self.v0, self.u = mv(self.anchor), mv(self.d)                                        # v = v0 + ηu
        # ‖Σ c_i g_i‖ ≤ ‖c‖₂ · sqrt(tr K): an update far below that bound is rounding, not a direction
        # (e.g. a group of identical responses, whose coefficients sum to zero).
        self.trace_root = gram.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0.0).sqrt()   # (B,)
        self.qa = (self.d * self.u).sum(-1)                          # ‖c(η)‖²_K = γ + 2bη + aη², each (B, T)
        self.qb = (self.anchor * self.u).sum(-1)
        self.qg = (self.anchor * self.v0).sum(-1)

    def m(self, eta):
        """m_τ(η) = vᵀâ − Σ_i τq̂σ̂_i |v_i| at (B, T, P) ratios."""
        v = self.v0[..., None, :] + eta[..., None] * self.u[..., None, :]
        return (v * self.centre[..., None, :]).sum(-1) - (self.box[..., None, :] * v.abs()).sum(-1)

    def norm(self, eta):
        """‖c(η)‖_K at (B, T, P) ratios."""
        sq = self.qg[..., None] + 2 * self.qb[..., None] * eta + self.qa[..., None] * eta**2
        return sq.clamp_min(0.0).sqrt()

    def breakpoints(self):
        """0, 1 and the ratios where some v_i(η) changes sign (the kinks of m_τ): (B, T, G+2), sorted."""
        moving = self.u.abs() > 0
        kinks = -self.v0 / torch.where(moving, self.u, torch.ones_like(self.u))
        kinks = torch.where(moving & (kinks > 0) & (kinks < 1), kinks, torch.ones_like(kinks))
        ends = self.centre.new_tensor([0.0, 1.0]).expand(*kinks.shape[:-1], 2)
        return torch.sort(torch.cat([ends, kinks], -1), -1).values

    def solve(self, n_bisect: int):
        """η*, m_τ(η*), accepted and coefficients, each over (B, T)."""
        cand = self.breakpoints()
        m_cand = self.m(cand)
        ok = m_cand >= 0
        # m_τ is piecewise linear in η, so if it is non-negative anywhere it is at a breakpoint: the largest
        # such breakpoint is a safe start, and the safe set is an interval (m_τ concave), so bisection
        # between it and the unsafe end 1 finds the largest safe η.
        feasible = ok.any(-1)
        lo = torch.where(ok, cand, torch.full_like(cand, -1.0)).amax(-1).clamp_min(0.0)
        ones = torch.ones_like(lo)
        at_one = self.m(ones[..., None])[..., 0] >= 0
        lo = torch.where(at_one, ones, lo)
        hi = ones.clone()
        for _ in range(n_bisect):
            mid = (lo + hi) / 2
            safe = self.m(mid[..., None])[..., 0] >= 0
            lo = torch.where(safe, mid, lo)
            hi = torch.where(safe, hi, mid)
        eta = torch.where(feasible, lo, torch.full_like(lo, math.nan))
        m_eta = torch.where(feasible, self.m(lo[..., None])[..., 0], torch.full_like(lo, math.nan))
        coef = self.anchor + lo[..., None] * self.d
        bound = coef.norm(dim=-1) * self.trace_root[:, None]
        accepted = feasible & (self.norm(lo[..., None])[..., 0] > 1e-8 * bound) & (bound > 0)
        coef = coef * accepted[..., None]
        return eta, m_eta, accepted, coef


def _recovery_inputs(centre, sigma, q, gram, *, one_group: bool = False):
    """centre, sigma: (B, G) (or (G,) for ``one_group``), gram: (B, G, G) (or (G, G)), q ≥ 0: checked, float64.

    Every value finite, σ̂ ≥ 0 (a negative box half-width would turn the worst case into a best case)."""
    c = as_tensor(centre, name="centre", dtype=torch.float64)
    s = as_tensor(sigma, name="sigma", dtype=torch.float64, device=c.device)
    k = as_tensor(gram, name="gram", dtype=torch.float64, device=c.device)
    rows = 1 if one_group else 2
    if c.ndim != rows or s.shape != c.shape or k.shape != (*c.shape, c.shape[-1]):
        want = "(G,) and gram (G, G)" if one_group else "(B, G) and gram (B, G, G)"
        raise ValueError(f"need centre and sigma of shape {want}; got {tuple(c.shape)}, {tuple(s.shape)}, "
                         f"{tuple(k.shape)}")
    for t, name in ((c, "centre"), (s, "sigma"), (k, "gram")):
        check_finite(t, name)
    if bool((s < 0).any()):
        raise ValueError("sigma must be >= 0: it is the half-width of each response's coefficient interval")
    return c, s, check_real(q, "q", minimum=0.0), k


def worst_case_agreement(eta, centre, sigma, q: float, gram, tau: float = 1.0) -> torch.Tensor:
    """m_τ(η) = min over the box C(τ) of aᵀK c(η), for one group; τ = 1 is the calibrated box's m(η).

    eta: (P,), centre and sigma: (G,), gram: (G, G). Returns (P,) float64.
    """
    c, s, q, k = _recovery_inputs(centre, sigma, q, gram, one_group=True)
    tau = check_real(tau, "tau", minimum=0.0)
    e = as_tensor(eta, name="eta", dtype=torch.float64, device=c.device).reshape(-1)
    check_finite(e, "eta")
    path = _Path(c[None], s[None], q, k[None], torch.tensor([[tau]], dtype=torch.float64, device=c.device))
    return path.m(e.reshape(1, 1, -1))[0, 0]


def gate_scores(centre, sigma, q: float, gram, *, rho_max: float = 10.0, n_bisect: int = 30) -> torch.Tensor:
    """ρ per group: the largest τ ∈ [0, rho_max] at which the group's safe recovery is accepted.

    Found by bisection over τ, which assumes acceptance is monotone in τ (a smaller box can only make an
    update safer; exact for identity geometry, and what we observe with general Gram matrices). The gate
    itself never relies on it: ``safe_recovery`` decides acceptance at the selected τ directly.
    centre, sigma: (B, G); gram: (B, G, G). Returns (B,) float64, −inf where not accepted even at τ = 0.
    """
    c, s, q, k = _recovery_inputs(centre, sigma, q, gram)
    return _gate_scores(c, s, q, k, check_real(rho_max, "rho_max", minimum=0.0), check_bisect(n_bisect))


def _gate_scores(centre, sigma, q: float, gram, rho_max: float = 10.0, n_bisect: int = 30) -> torch.Tensor:
    """``gate_scores`` on checked float64 inputs."""
    b = centre.shape[0]
    accepted_at = lambda tau: _Path(centre, sigma, q, gram, tau[:, None]).solve(0)[2][:, 0]  # noqa: E731
    zero = centre.new_zeros(b)
    base = accepted_at(zero)
    lo, hi = zero, centre.new_full((b,), float(rho_max))
    top = accepted_at(hi)
    for _ in range(n_bisect):
        mid = (lo + hi) / 2
        ok = accepted_at(mid)
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    rho = torch.where(top, hi, lo)
    return torch.where(base, rho, torch.full_like(rho, -math.inf))


def safe_recovery(centre, sigma, q: float, gram, tau=1.0, *, n_bisect: int = 50, valid=None,
                  with_rho: bool = False) -> Recovery:
    """Geometry-guided safe recovery for a batch of padded groups.

    centre, sigma: (B, G) â and σ̂ (padded slots: zero centre, any positive sigma);
    q: the conformal quantile q̂ ≥ 0; gram: (B, G, G) Gram of gradient features (zero rows/cols on padding);
    tau: a box inflation ≥ 0 or a (T,) grid of them (1 = the calibrated box; 0 = no box, plain centre);
    valid: (B, G) bool mask of real slots or None; with_rho: also compute the gate scores ρ.
    Returns a ``Recovery``; a single group can be passed as (1, G) and (1, G, G).
    """
    c, s, q, k = _recovery_inputs(centre, sigma, q, gram)
    n_bisect = check_bisect(n_bisect)
    taus = as_tensor(tau, name="tau", dtype=torch.float64, device=c.device).reshape(-1)
    if bool((taus < 0).any()) or not bool(torch.isfinite(taus).all()):
        raise ValueError("tau must be finite and >= 0 (a box inflation; m_τ is concave only for τ >= 0)")
    if valid is not None:
        valid = as_bool_rows(valid, name="valid", device=c.device)
        if valid.shape != c.shape:
            raise ValueError(f"valid must have centre's shape {tuple(c.shape)} (True for a real slot), got "
                             f"{tuple(valid.shape)}")
    if not isinstance(with_rho, (bool, type(None))):
        raise ValueError(f"with_rho must be True or False, got {with_rho!r:.40}")
    path = _Path(c, s, q, k, taus[None, :].expand(c.shape[0], -1))
    eta, m_eta, accepted, coef = path.solve(n_bisect)
    if valid is not None:
        coef = coef * valid[:, None, :]
    rho = _gate_scores(c, s, q, k) if with_rho else None
    return Recovery(taus, path.anchor, eta, m_eta, accepted, coef, rho)


def lm_head_gradient_features(hidden, logits, tokens, mask, *, dims: tuple[int, int] | None = (16, 16),
                              seed: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """Gradient features of each response's length-normalised log-probability w.r.t. the output layer W.

    hidden: (N, T, h) final hidden states at the positions that predict the response tokens;
    logits: (N, T, V) the logits there (before temperature); tokens: (N, T) response token ids;
    mask: (N, T) 1 for real response tokens. With ℓ_i = (1/T_i) Σ_t log softmax(z_t / temperature)[y_t],

        ∂ℓ_i/∂W = 1/(T_i · temperature) · Σ_t (e_{y_t} − p_t) h_tᵀ           (V × h).

    dims=None returns that gradient flattened (V·h columns: small models and tests only). dims=(k1, k2)
    returns the Kronecker random projection 1/(T_i·temperature) Σ_t (R_V(e_{y_t} − p_t)) ⊗ (R_h h_t) with
    seeded Gaussian R_V (k1 × V) and R_h (k2 × h) of variance 1/k: since E[(R_V ⊗ R_h)ᵀ(R_V ⊗ R_h)] = I,
    inner products of these k1·k2 features are unbiased estimates of the exact ⟨∂ℓ_i/∂W, ∂ℓ_j/∂W⟩, at the
    cost of one (N, T, V) × (V, k1) product. Returns (N, k1·k2) (or (N, V·h)) float32.
    """
    for name, t in (("hidden", hidden), ("logits", logits), ("tokens", tokens)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not (hidden.is_floating_point() and logits.is_floating_point()):
        raise ValueError(f"hidden and logits must be float tensors, got {hidden.dtype} and {logits.dtype}")
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise ValueError(f"tokens must be integer token ids, got {tokens.dtype}")
    h, z = hidden.float(), logits.float()
    if h.ndim != 3 or z.ndim != 3 or z.shape[:2] != h.shape[:2] or tuple(tokens.shape) != tuple(h.shape[:2]):
        raise ValueError(f"need hidden (N, T, h), logits (N, T, V) and tokens (N, T); got {tuple(h.shape)}, "
                         f"{tuple(z.shape)}, {tuple(tokens.shape)}")
    temperature = check_real(temperature, "temperature", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    vocab, width = z.shape[-1], h.shape[-1]
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):  # a negative id would wrap around
        raise ValueError(f"tokens must be ids in [0, {vocab}) (the logits' last dimension), got "
                         f"{tokens[(tokens < 0) | (tokens >= vocab)][0].item()}")
    if dims is None:
        columns = vocab * width
    else:
        dims = check_feature_dims(dims)
        columns = dims[0] * dims[1]
        if max(dims[0] * vocab, dims[1] * width) > _MAX_FEATURE_ENTRIES:
            raise ValueError(f"dims={dims} needs random projections of {dims[0]}×{vocab} and {dims[1]}×{width} "
                             f"numbers, more than {_MAX_FEATURE_ENTRIES} (2**28): choose smaller dims")
    if h.shape[0] * columns > _MAX_FEATURE_ENTRIES:
        raise ValueError(f"{h.shape[0]} responses × {columns} feature columns exceeds {_MAX_FEATURE_ENTRIES} "
                         f"(2**28) numbers" + (": pass dims=(k1, k2) for a random projection" if dims is None
                                               else ": choose smaller dims"))
    m = as_tensor(mask, name="mask", device=h.device, dtype=torch.float32)
    if m.shape != h.shape[:2]:
        raise ValueError(f"mask must have shape {tuple(h.shape[:2])} (N, T), got {tuple(m.shape)}")
    if not bool(((m == 0) | (m == 1)).all()):
        raise ValueError("mask must hold 0 and 1 only (1 for a real response token)")
    lengths = m.sum(-1, keepdim=True)
    if bool((lengths == 0).any()):
        raise ValueError("every response needs at least one real token (a row of mask is all zeros)")
    p = torch.softmax(z / temperature, -1)
    scale = (m / (lengths * temperature))[..., None]                                 # (N, T, 1)
    if dims is None:
        a = torch.nn.functional.one_hot(tokens.long(), vocab).float() - p            # (N, T, V)
        return torch.einsum("ntv,nth->nvh", a * scale, h).reshape(h.shape[0], -1)
    k1, k2 = dims
    gen = torch.Generator().manual_seed(seed)
    r_v = (torch.randn(k1, vocab, generator=gen) / math.sqrt(k1)).to(h.device)
    r_h = (torch.randn(k2, width, generator=gen) / math.sqrt(k2)).to(h.device)
    a = r_v.T[tokens.long()] - p @ r_v.T                                             # (N, T, k1)
    b = h @ r_h.T                                                                    # (N, T, k2)
    return torch.einsum("nti,ntj->nij", a * scale, b).reshape(h.shape[0], k1 * k2)
