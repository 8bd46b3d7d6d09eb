"""Canonical Countdown expressions: when two answers are the same solution.

Canonical form (what "distinct solutions" means, for the solver and the diversity metrics):
expressions are equal up to commutativity and associativity of + and *, and up to moving signs and
inverses around, with - and / folded in by treating a sum as a multiset of signed terms and a product
as a sign times a multiset of factors with exponents ±1:

- ``a+b == b+a``, ``(a+b)+c == a+(b+c)``, likewise for ``*``;
- ``a-(b-c) == a-b+c == a+c-b`` and ``a/(b/c) == a*c/b`` (a subtraction flips the signs of a sum's
  terms, a division inverts a product's factors);
- a unary minus is a sign: ``-a+b == b-a``, ``(-a)*b == -(a*b)``, ``(-a-b)*c == -((a+b)*c)``;
- a sign moves freely between the factors of one product (numerators and denominators alike) and out
  of it into the sum the product is a term of: ``x*(a-b) == -(x*(b-a))``, ``(a-b)/(c-d) ==
  (b-a)/(d-c)``, ``d-(b-a)*c == d+(a-b)*c == (a-b)*c+d``, ``d-a/(b-c) == d+a/(c-b)``. To make the
  choice canonical, every sum that is a factor of a product is *oriented*: it is written as given or
  negated (the sign going to the product), whichever has a positive value, as a person writes it
  (``(5-2)*7+3``, not ``3-(2-5)*7``). A sum factor whose value is 0, or undefined (a division by zero
  inside), takes the orientation with fewer negative terms, then the one with the smaller canonical
  text. A sum that is its own negation (its terms cancel in pairs, such as ``3-3``) has no
  orientation, so a product with such a factor has no sign and is added and subtracted alike:
  ``5-7*(3-3) == 5+(3-3)*7``. Every rearrangement here keeps the value;
- nothing else: no distributivity (``a*(b+c) != a*b+a*c``, and they use different numbers anyway), no
  cancellation (``a-a`` keeps both terms, ``a/a`` both factors), no identities (``a+0 != a-0``,
  ``a*1 != a/1``), and a sum that is not a factor keeps its orientation (``a-b != b-a``: different
  values). Equal numbers are interchangeable.

Hence two expressions with different values never share a canonical form (an expression that divides
by zero has no value and is never a correct answer; its form may lose the zero divisor:
``2/(5/(3-3)) -> 2*(3-3)/5``), and the count of distinct solutions is the count a person makes: for
[2, 3, 5, 7] -> 24, ``(5-2)*7+3``, ``3-(2-5)*7`` and ``3+(2-5)*(-7)`` are one solution.

The canonical string lists a sum's positive terms first, then its negative ones, and a product's
numerator factors first, then its denominators, each group sorted by text, with no spaces and only the
parentheses a factor that is a sum needs (a negative product that is the whole expression is written
``-(5-2)*7``). It parses back to itself and scores 1.0 when the expression does (a solver solution is a
valid answer). Time is bounded as the answer is (``MAX_ANSWER_CHARS``): each operation sorts and joins
its operands' texts, and a sum with terms of both signs that becomes a factor has its exact value
computed once.
"""

from __future__ import annotations

from fractions import Fraction


class CanonicalExpr:
    """A canonical expression node; ``text`` is its canonical string, the identity used everywhere.

    kind "n": items is the integer. kind "+": items is a tuple of (sign, node), sign ±1, nodes not sums,
    sorted positives first, then by text. kind "*": items is a tuple of (exponent, node), exponent ±1,
    nodes not products, sorted numerators first, then by text. A "+" node with one term is a negation.
    odd: the node is its own negation under the rules (a sum whose terms cancel in pairs, such as
    ``3-3``, or a product with such a factor). ``_value(node)`` is its exact value, computed when the
    orientation of a sum needs it and then kept.
    """

    __slots__ = ("_value", "items", "kind", "odd", "text")

    def __init__(self, kind: str, items, text: str, odd: bool = False):
        self.kind, self.items, self.text, self.odd, self._value = kind, items, text, odd, UNSET

    def __repr__(self) -> str:
        return f"CanonicalExpr({self.text!r})"


UNSET = object()


def _value(x: CanonicalExpr) -> Fraction | None:
    """Exact value of a node, None after a division by zero (a "*" node's without any outer sign)."""
    v = x._value
    if v is not UNSET:
        return v
    if x.kind == "n":
        v = Fraction(x.items)
    elif x.kind == "+":
        v = Fraction(0)
        for s, node in x.items:
            t = _value(node)
            if t is None:
                v = None
                break
            v = v + t if s > 0 else v - t
    else:
        v = Fraction(1)
        for e, node in x.items:
            t = _value(node)
            if t is None or (e < 0 and t == 0):
                v = None
                break
            v = v * t if e > 0 else v / t
    x._value = v
    return v


def canonical_leaf(value: int) -> CanonicalExpr:
    return CanonicalExpr("n", value, str(value))


def _terms(x: CanonicalExpr) -> tuple:
    return x.items if x.kind == "+" else ((1, x),)


def _sum_order(term) -> tuple:
    return -term[0], term[1].text


def _make_sum(terms) -> CanonicalExpr:
    # A term that is its own negation carries no sign of its own: x - t == x + t when t == -t.
    terms = [(1, node) if node.odd else (s, node) for s, node in terms]
    if len(terms) == 1 and terms[0][0] == 1:
        return terms[0][1]
    terms.sort(key=_sum_order)
    parts, plus, minus = [], [], []
    for s, node in terms:
        if s > 0:
            parts.append("+" + node.text)
            if not node.odd:
                plus.append(node.text)
        else:
            parts.append("-" + node.text)
            minus.append(node.text)
    text = "".join(parts)
    # Its own negation when the terms that have a sign cancel in pairs (both lists are sorted).
    return CanonicalExpr("+", tuple(terms), text[1:] if text[0] == "+" else text, odd=plus == minus)


def canonical_negation(x: CanonicalExpr) -> CanonicalExpr:
    return _make_sum(tuple((-s, node) for s, node in _terms(x)))


def canonical_sum(x: CanonicalExpr, y: CanonicalExpr) -> CanonicalExpr:
    return _make_sum(_terms(x) + _terms(y))


def canonical_difference(x: CanonicalExpr, y: CanonicalExpr) -> CanonicalExpr:
    return _make_sum(_terms(x) + tuple((-s, node) for s, node in _terms(y)))


def _orientation_key(x: CanonicalExpr) -> tuple[int, str]:
    """Structural tie-break between a sum and its negation: fewer negative terms, then smaller text."""
    return (sum(s < 0 for s, _ in x.items) if x.kind == "+" else 0), x.text


def _factors(x: CanonicalExpr) -> tuple[int, tuple]:
    """(sign, factors) of x as a factor of a product, with every sum factor in its canonical orientation.

    A sum factor is kept as written or negated (its sign moved to the product), whichever has a positive
    value; when the value is 0 or undefined, whichever has fewer negative terms, then the smaller text.
    A sum that is its own negation (``3-3``) has no orientation.
    """
    if x.kind == "*":
        return 1, x.items
    if x.kind == "+" and not x.odd:
        if x.items[0][0] < 0:  # all terms negative (positives sort first): the value is <= 0
            flip = True
        elif x.items[-1][0] > 0:  # all positive (terms are leaves and products, never negative)
            flip = False
        else:
            v = _value(x)
            flip = (v < 0) if v else _orientation_key(canonical_negation(x)) < _orientation_key(x)
        if flip:
            flipped = canonical_negation(x)  # the inner node for a negated leaf or product, else the sum negated
            return -1, (flipped.items if flipped.kind == "*" else ((1, flipped),))
    return 1, ((1, x),)


def _make_product(sign: int, factors) -> CanonicalExpr:
    if len(factors) == 1 and factors[0][0] == 1:
        node = factors[0][1]
    else:
        items = tuple(sorted(factors, key=lambda f: (-f[0], f[1].text)))
        parts = []
        for i, (e, f) in enumerate(items):
            piece = f.text if f.kind == "n" else f"({f.text})"
            parts.append(piece if i == 0 else ("*" if e > 0 else "/") + piece)
        node = CanonicalExpr("*", items, "".join(parts), odd=any(f.odd for _, f in items))
    # A product with a factor that is its own negation is its own negation: it keeps no sign.
    return node if sign > 0 or node.odd else canonical_negation(node)


def canonical_product(x: CanonicalExpr, y: CanonicalExpr) -> CanonicalExpr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + fy)


def canonical_quotient(x: CanonicalExpr, y: CanonicalExpr) -> CanonicalExpr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + tuple((-e, f) for e, f in fy))


CANONICAL_OPS = {"+": canonical_sum, "-": canonical_difference, "*": canonical_product, "/": canonical_quotient}
