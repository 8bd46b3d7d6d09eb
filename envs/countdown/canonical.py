"""Canonical Countdown expressions: when two answers are the same solution.

Canonical form (what "distinct solutions" means, for the solver and the diversity metrics):
expressions are equal up to commutativity and associativity of + and *, with - and / folded in by
treating a sum as a multiset of signed terms and a product as a multiset of factors with exponents ±1:

- ``a+b == b+a``, ``(a+b)+c == a+(b+c)``, likewise for ``*``;
- ``a-(b-c) == a-b+c == a+c-b`` and ``a/(b/c) == a*c/b`` (a subtraction flips the signs of a sum's
  terms, a division inverts a product's factors);
- a unary minus is a sign: ``-a+b == b-a``, and a sign is pulled out of a factor that is a single
  negated term or a sum of only negated terms: ``(-a)*b == -(a*b)``, ``(-a-b)*c == -((a+b)*c)``;
- nothing else: no distributivity (``a*(b+c) != a*b+a*c``, and they use different numbers anyway), no
  cancellation (``a-a`` keeps both terms), and no choice of orientation for a factor that is a mixed
  sum: ``d-(b-a)*c`` and ``d+(a-b)*c`` are two solutions. Equal numbers are interchangeable.

The canonical string lists a sum's positive terms first, then its negative ones, and a product's
numerator factors first, then its denominators, each group sorted by text, with no spaces and only the
parentheses a factor that is a sum needs. It parses back to itself and scores 1.0 when the expression
does (a solver solution is a valid answer).
"""

from __future__ import annotations


class _Expr:
    """A canonical expression node; ``text`` is its canonical string, the identity used everywhere.

    kind "n": items is the integer. kind "+": items is a tuple of (sign, node), sign ±1, nodes not sums,
    sorted positives first, then by text. kind "*": items is a tuple of (exponent, node), exponent ±1,
    nodes not products, sorted numerators first, then by text. A "+" node with one term is a negation.
    """

    __slots__ = ("kind", "items", "text")

    def __init__(self, kind: str, items, text: str):
        self.kind, self.items, self.text = kind, items, text

    def __repr__(self) -> str:
        return f"_Expr({self.text!r})"


def _leaf(value: int) -> _Expr:
    return _Expr("n", value, str(value))


def _terms(x: _Expr) -> tuple:
    return x.items if x.kind == "+" else ((1, x),)


def _make_sum(terms) -> _Expr:
    if len(terms) == 1 and terms[0][0] == 1:
        return terms[0][1]
    items = tuple(sorted(terms, key=lambda t: (-t[0], t[1].text)))
    text = "".join(
        ("-" if s < 0 else ("+" if i else "")) + node.text for i, (s, node) in enumerate(items)
    )
    return _Expr("+", items, text)


def _negate(x: _Expr) -> _Expr:
    return _make_sum(tuple((-s, node) for s, node in _terms(x)))


def _add(x: _Expr, y: _Expr) -> _Expr:
    return _make_sum(_terms(x) + _terms(y))


def _sub(x: _Expr, y: _Expr) -> _Expr:
    return _make_sum(_terms(x) + tuple((-s, node) for s, node in _terms(y)))


def _factors(x: _Expr) -> tuple[int, tuple]:
    """(sign, factors) of x as a factor of a product, pulling out the signs the canonical form pulls."""
    if x.kind == "*":
        return 1, x.items
    if x.kind == "+" and all(s < 0 for s, _ in x.items):
        inner = _negate(x)  # -t for one term, or the all-positive sum
        return -1, (inner.items if inner.kind == "*" else ((1, inner),))
    return 1, ((1, x),)


def _make_product(sign: int, factors) -> _Expr:
    if len(factors) == 1 and factors[0][0] == 1:
        node = factors[0][1]
    else:
        items = tuple(sorted(factors, key=lambda f: (-f[0], f[1].text)))
        parts = []
        for i, (e, f) in enumerate(items):
            piece = f.text if f.kind == "n" else f"({f.text})"
            parts.append(piece if i == 0 else ("*" if e > 0 else "/") + piece)
        node = _Expr("*", items, "".join(parts))
    return node if sign > 0 else _negate(node)


def _mul(x: _Expr, y: _Expr) -> _Expr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + fy)


def _div(x: _Expr, y: _Expr) -> _Expr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + tuple((-e, f) for e, f in fy))


_CANON_OPS = {"+": _add, "-": _sub, "*": _mul, "/": _div}
