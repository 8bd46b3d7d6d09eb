"""Countdown: scorer safety and rules, canonical form, solver, generator, gymnasium env, parquet I/O."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import gymnasium as gym
import pandas as pd
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import setpo.envs  # noqa: F401  (registers the ids)
from setpo.envs.countdown import (
    CountdownEnv,
    CountdownInstance,
    canonical_form,
    distinct_correct_solutions,
    export_parquet,
    extract_answer,
    generate_instances,
    load_countdown_tasks,
    make_prompt,
    make_splits,
    score_answer,
    solve,
    verl_compute_score,
)
from setpo.trl.rewards import countdown_reward

REPO = Path(__file__).resolve().parents[1]


def ans(expr: str) -> str:
    return f"<think>some reasoning</think> <answer>{expr}</answer>"


# ----------------------------------------------------------------------------------------------------
# score_answer: the rules
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (ans("44 + 19 + 35"), 1.0),
        (ans(" (44 + 19) + 35 "), 1.0),
        (ans("35+44+19"), 1.0),
        (ans("44\n+ 19\n+ 35"), 1.0),  # newlines inside the answer are whitespace
        (ans("-19 + 44 + 35 + 19 + 19"), 0.1),  # 19 used three times
        (ans("44 + 19"), 0.1),  # 35 missing
        (ans("44 + 19 + 35 + 0"), 0.1),  # a number not in the instance
        (ans("44 + 19 - 35"), 0.1),  # wrong value
        (ans("44 + 19 + 35 = 98"), 0.1),  # the expression alone, as in the reference
        (ans("(44 + 19 + 35"), 0.1),  # unbalanced
        (ans("44.0 + 19 + 35"), 0.1),  # floats are not integer literals
        ("<answer></answer>", 0.0),
        ("<answer>   </answer>", 0.0),
        ("44 + 19 + 35", 0.0),  # no tags
        ("<answer>44 + 19 + 35", 0.0),  # unclosed
        ("</answer>44 + 19 + 35<answer>", 0.0),  # tags in the wrong order
        ("<ANSWER>44+19+35</ANSWER>", 0.0),  # tags are case-sensitive, as in the reference
    ],
)
def test_score_answer_rules(text, expected):
    assert score_answer(text, [44, 19, 35], 98) == expected


def test_division_is_exact_and_tolerance_is_1e5():
    # 3 / 7 * 7 is 3 exactly with Fractions, where floats give 2.9999999999999996.
    assert score_answer(ans("3 / 7 * 7"), [3, 7, 7], 3) == 1.0
    assert score_answer(ans("(1 + 2) / 3"), [1, 2, 3], 1) == 1.0
    assert score_answer(ans("1 / 3"), [1, 3], Fraction(1, 3)) == 1.0
    assert score_answer(ans("1 / 3"), [1, 3], 0.333334) == 1.0  # |1/3 - 0.333334| < 1e-5
    assert score_answer(ans("1 / 3"), [1, 3], 0.3334) == 0.1


def test_duplicate_numbers_are_a_multiset():
    assert score_answer(ans("5 * 5 - 1"), [5, 1, 5], 24) == 1.0
    assert score_answer(ans("5 * 1 - 1"), [5, 1, 5], 4) == 0.1


def test_last_answer_tag_counts():
    assert score_answer("<answer>1+2</answer> no, <answer>1*2</answer>", [1, 2], 3) == 0.1
    assert score_answer("<answer>1*2</answer> no, <answer>1+2</answer>", [1, 2], 3) == 1.0
    assert extract_answer("<answer>a</answer><answer>b</answer>") == "b"
    assert extract_answer("<answer><answer> 7 </answer>") == "7"
    assert extract_answer("no tags") is None


def test_unary_minus_is_allowed_as_a_sign():
    assert score_answer(ans("-5 + 30"), [5, 30], 25) == 1.0
    assert score_answer(ans("-(5 - 30)"), [5, 30], 25) == 1.0
    assert score_answer(ans("+30 - 5"), [5, 30], 25) == 0.1  # unary plus is not an operation of the game


def test_caller_errors_raise_value_error():
    with pytest.raises(ValueError, match="numbers"):
        score_answer(ans("1"), "12", 1)
    with pytest.raises(ValueError, match="numbers"):
        score_answer(ans("1"), [1.5], 1)
    with pytest.raises(ValueError, match="numbers"):
        score_answer("no answer", [], 1)
    with pytest.raises(ValueError, match="target"):
        score_answer(ans("1"), [1], "one")
    with pytest.raises(ValueError, match="text"):
        score_answer(None, [1], 1)


# ----------------------------------------------------------------------------------------------------
# Hostile answers: in a child process, so that a hang or a blow-up fails the test instead of the suite
# ----------------------------------------------------------------------------------------------------

MB = 1 << 20
HOSTILE = {
    "power": ("<answer>2**999999</answer>", [2, 999999], 4, 0.1),
    "tower": ("<answer>9**9**9</answer>", [9, 9, 9], 1, 0.1),
    "import": ("<answer>__import__('os').system('true')</answer>", [1], 1, 0.1),
    "dunder": ("<answer>().__class__</answer>", [1], 1, 0.1),
    "bases": ("<answer>().__class__.__bases__[0].__subclasses__()</answer>", [1], 1, 0.1),
    "lambda": ("<answer>(lambda: 1)()</answer>", [1], 1, 0.1),
    "one_mb_inside": ("<answer>" + "1+" * (MB // 2) + "1</answer>", [1], 1, 0.1),
    "one_mb_digits": ("<answer>" + "9" * MB + "</answer>", [9], 9, 0.1),
    "one_mb_no_tags": ("x" * MB, [1], 1, 0.0),
    "many_open_tags": ("<answer>" * (MB // 8) + "1</answer>", [1], 1, 1.0),
    "many_unclosed_tags": ("<answer>1" * (MB // 9), [1], 1, 0.0),
    "nested_10k": ("<answer>" + "(" * 10_000 + "1" + ")" * 10_000 + "</answer>", [1], 1, 0.1),
    "nested_17": ("<answer>" + "(" * 17 + "1" + ")" * 17 + "</answer>", [1], 1, 0.1),
    "unbalanced_10k": ("<answer>" + "(" * 10_000 + "</answer>", [1], 1, 0.1),
    "long_chain": ("<answer>" + "-".join(["1"] * 128) + "</answer>", [1] * 128, -126, 1.0),
    "div_zero": ("<answer>(3 / (2 - 2)) + 1</answer>", [3, 2, 2, 1], 4, 0.1),
    "div_zero_then_times_zero": ("<answer>(1 / 0) * 0</answer>", [1, 0, 0], 0, 0.1),
    "arabic_digits": ("<answer>\u0661 + \u0662</answer>", [1, 2], 3, 0.1),
    "fullwidth_digits": ("<answer>\uff11 + \uff12</answer>", [1, 2], 3, 0.1),
    "superscript": ("<answer>2\u00b2</answer>", [2], 4, 0.1),
    "used_twice": ("<answer>3 * 3 + 1</answer>", [3, 1, 4], 10, 0.1),
    "missing_number": ("<answer>3 * 4</answer>", [3, 1, 4], 12, 0.1),
    "float": ("<answer>1.5 * 2</answer>", [1, 2], 3, 0.1),
    "float_exp": ("<answer>1e3</answer>", [1], 1000, 0.1),
    "empty": ("<answer></answer>", [1], 1, 0.0),
    "two_tags_last_wrong": ("<answer>1+2</answer><answer>2**2</answer>", [1, 2], 3, 0.1),
    "two_tags_last_right": ("<answer>2**2</answer><answer>1+2</answer>", [1, 2], 3, 1.0),
    "underscore_literal": ("<answer>1_000 + 1</answer>", [1000, 1], 1001, 0.1),
    "hex": ("<answer>0x10</answer>", [16], 16, 0.1),
    "leading_zero": ("<answer>01 + 2</answer>", [1, 2], 3, 0.1),
    "walrus": ("<answer>(x := 3)</answer>", [3], 3, 0.1),
    "tuple": ("<answer>(1, 2)</answer>", [1, 2], 3, 0.1),
    "comparison": ("<answer>1 < 2</answer>", [1, 2], 1, 0.1),
    "floordiv": ("<answer>7 // 2</answer>", [7, 2], 3, 0.1),
    "modulo": ("<answer>7 % 4</answer>", [7, 4], 3, 0.1),
    "bitshift": ("<answer>1 << 99999999</answer>", [1, 99999999], 1, 0.1),
    "nul_byte": ("<answer>1\x00+2</answer>", [1, 2], 3, 0.1),
    "surrogate": ("<answer>1+\ud800</answer>", [1], 1, 0.1),
    "huge_literal": ("<answer>" + "9" * 250 + "</answer>", [int("9" * 250)], int("9" * 250), 1.0),
}

_CHILD = textwrap.dedent(
    """
    import json, sys, tracemalloc
    sys.path.insert(0, {repo!r})
    from setpo.envs.countdown import score_answer, canonical_form
    cases = json.load(open({cases!r}))
    marker = {marker!r}
    for name, (text, numbers, target, _) in cases.items():
        tracemalloc.start()
        reward = score_answer(text, numbers, target)
        canonical_form(text)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(json.dumps([name, reward, peak]), flush=True)
    import os
    print(json.dumps(["pwned", os.path.exists(marker), 0]), flush=True)
    """
)


def test_hostile_answers_score_low_and_never_raise(tmp_path):
    marker = tmp_path / "pwned"
    cases = dict(HOSTILE)
    cases["open_file"] = (f"<answer>open({str(marker)!r}, 'w')</answer>", [1], 1, 0.1)
    cases["exec"] = (f"<answer>exec(\"open({str(marker)!r}, 'w')\")</answer>", [1], 1, 0.1)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    code = _CHILD.format(repo=str(REPO), cases=str(path), marker=str(marker))
    # The timeout only turns a hang into a failure; nothing here measures speed.
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as err:
        done = [json.loads(line)[0] for line in (err.stdout or b"").decode().splitlines()]
        pending = [n for n in cases if n not in done]
        pytest.fail(f"scoring hung on hostile input {pending[:1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {name: (reward, peak) for name, reward, peak in map(json.loads, proc.stdout.splitlines())}
    assert results.pop("pwned")[0] is False
    for name, (_, _, _, expected) in cases.items():
        reward, peak = results[name]
        assert reward == expected, name
        # Memory stays bounded: beyond the input itself (held by the caller) scoring allocates little.
        assert peak < 8 * MB, (name, peak)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-*/() .<>answer/\n*_x")), max_size=80))
def test_random_text_never_raises(body):
    for text in (body, f"<answer>{body}</answer>"):
        assert score_answer(text, [1, 2, 3], 6) in (0.0, 0.1, 1.0)
        form = canonical_form(body)
        if form is not None:
            assert canonical_form(form) == form


# ----------------------------------------------------------------------------------------------------
# Canonical form
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        ("3+4", "4+3"),
        ("(3+4)+5", "3+(4+5)"),
        ("3*4", "4*3"),
        ("(3*4)*5", "3*(4*5)"),
        ("5*(3+4)", "(4+3)*5"),
        ("9-(4-2)", "9-4+2"),
        ("9-(4-2)", "2+9-4"),
        ("9-4-2", "9-(4+2)"),
        ("8/(4/2)", "8*2/4"),
        ("8/4/2", "8/(4*2)"),
        ("(8/4)*2", "2*8/4"),
        ("-5+30", "30-5"),
        ("(-2)*3", "-(2*3)"),
        ("(-2-3)*4", "-((2+3)*4)"),
        ("10 - 3 * (-2)", "10 + 3 * 2"),
        (" 3 +\n4 ", "4+3"),
        # a sign moves between the factors of a product and out into the sum around it
        ("9-(5-2)*3", "9+(2-5)*3"),
        ("3-(2-5)*7", "(5-2)*7+3"),
        ("3+(2-5)*(-7)", "(5-2)*7+3"),
        ("4*(3-5)", "-(4*(5-3))"),
        ("(2-5)*(3-7)", "(5-2)*(7-3)"),
        ("(2-5)/(3-7)", "(5-2)/(7-3)"),  # numerator and denominator both flipped
        ("(2-5)/(7-3)", "-(5-2)/(7-3)"),
        ("9-8/(2-5)", "9+8/(5-2)"),  # a denominator's sign
        ("6/(-3)+1", "1-6/3"),
        ("(1-7+2)*3", "-((7-1-2)*3)"),  # a sum with more terms, its value decides the orientation
        ("5-7*(3-3)", "5+7*(3-3)"),  # a factor that is its own negation takes any sign
        ("5-(3-3)/7", "(3-3)/7+5"),
        ("(2+3-5)*4", "-((5-2-3)*4)"),  # a zero-valued factor: fewer negative terms, then text
    ],
)
def test_canonical_form_merges(a, b):
    assert canonical_form(a) is not None
    assert canonical_form(a) == canonical_form(b)


@pytest.mark.parametrize(
    "a, b",
    [
        ("3-4", "4-3"),
        ("8/4", "4/8"),
        ("2*(3+4)", "2*3+4"),
        ("(1+2)*4", "1*4+2*4"),  # no distributivity (and different numbers)
        ("1*2", "2/1"),
        ("(5-2)*7", "(2-5)*7"),  # a sum that is a factor is oriented, but values still differ
        ("9-(5-2)*3", "9+(5-2)*3"),
        ("(2-5)/(3-7)", "(5-2)/(3-7)"),
        ("5+0", "5-0"),  # no identities
        ("(3-3)*7", "(3-3)/7"),  # no cancellation: a zero factor still multiplies or divides
        ("(2+3-5)*4", "(5-2-3)*4"),  # negating a whole expression is no rearrangement, even of a 0
    ],
)
def test_canonical_form_keeps_different_solutions_apart(a, b):
    assert canonical_form(a) != canonical_form(b)


def test_canonical_form_rejects_what_is_not_an_expression():
    for bad in ["", "  ", "2**3", "1.5", "abc", "(", "1 2", "1=1", "+1", "\u0661", None, 12, "(" * 40 + "1" + ")" * 40]:
        assert canonical_form(bad) is None, bad


def _random_tree(rng: random.Random, leaves: list[int]):
    if len(leaves) == 1:
        return leaves[0]
    cut = rng.randrange(1, len(leaves))
    return (rng.choice("+-*/"), _random_tree(rng, leaves[:cut]), _random_tree(rng, leaves[cut:]))


def _render(tree, rng: random.Random | None = None, shuffle: bool = False) -> str:
    """Fully parenthesised text, a unary minus as a bare "-"; with shuffle, operands of + and * are swapped
    at random (rng is only used then)."""
    if isinstance(tree, int):
        return str(tree)
    if tree[0] == "neg":
        return "-" + _render(tree[1], rng, shuffle)
    op, left, right = tree
    if shuffle and op in "+*" and rng.random() < 0.5:
        left, right = right, left
    return f"({_render(left, rng, shuffle)}{op}{_render(right, rng, shuffle)})"


def _reassociate(tree, rng: random.Random):
    """Rotate ((a op b) op c) <-> (a op (b op c)) at random for op in + and *."""
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    left, right = _reassociate(left, rng), _reassociate(right, rng)
    if op in "+*" and not isinstance(left, int) and left[0] == op and rng.random() < 0.5:
        return (op, left[1], (op, left[2], right))
    return (op, left, right)


def _value(tree):
    """Exact value of a tree, None after a division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    if tree[0] == "neg":
        v = _value(tree[1])
        return None if v is None else -v
    op, left, right = tree
    a, b = _value(left), _value(right)
    if a is None or b is None:
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]  # the dict computes every entry


def test_canonical_form_is_invariant_idempotent_and_value_preserving():
    rng = random.Random(0)
    for _ in range(400):
        leaves = [rng.randint(1, 12) for _ in range(rng.randint(1, 6))]
        tree = _random_tree(rng, leaves)
        text = _render(tree, rng, shuffle=False)
        form = canonical_form(text)
        assert form is not None
        assert canonical_form(_render(tree, rng, shuffle=True)) == form, text
        assert canonical_form(_render(_reassociate(tree, rng), rng, shuffle=True)) == form, text
        assert canonical_form(form) == form
        value = _value(tree)
        if value is not None and value == int(value):
            assert score_answer(ans(form), leaves, int(value)) == 1.0, (text, form)


# Sign and inverse rearrangements (what a person calls the same solution), for the property tests.
# A tree is an int, ("neg", x) or (op, left, right); rendered with every binary operation in
# parentheses and a unary minus as a bare "-" (no parentheses of its own: "2*-3", "--(1+2)").

_trees = st.recursive(
    st.integers(0, 9),
    lambda kids: st.one_of(st.tuples(st.sampled_from("+-*/"), kids, kids), kids.map(lambda x: ("neg", x))),
    max_leaves=6,
)


def _tree_of(text: str):
    """The tree of an expression text (test-side parser, independent of the verifier's)."""
    import ast

    def walk(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp):
            return ("neg", walk(node.operand))
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}[type(node.op)]
        return (op, walk(node.left), walk(node.right))

    return walk(ast.parse(text, mode="eval").body)


def _leaves_of(tree) -> list[int]:
    if isinstance(tree, int):
        return [tree]
    return [v for kid in tree[1:] for v in _leaves_of(kid)]


def _neg(x):
    """-x as a person writes it: drop a double minus, turn a-b round into b-a, else a unary minus."""
    if isinstance(x, tuple) and x[0] == "neg":
        return x[1]
    if isinstance(x, tuple) and x[0] == "-":
        return ("-", x[2], x[1])
    return ("neg", x)


def _rearrange(tree, rng: random.Random):
    """A random value-preserving sign/inverse rearrangement of tree (plus commuting), bottom-up.

    At a product or quotient a sign moves between the two factors or out of it (x*y -> (-x)*(-y),
    -((-x)*y), -(x*(-y)), likewise for /); at a sum or difference a term's sign flips with the operator
    (x+y -> x-(-y), x-y -> x+(-y), -(y-x)); a unary minus is pushed into a difference (-(a-b) -> b-a)
    or a sum (-(x+y) -> -x-y); + and * commute. No distributivity, no cancellation.
    """
    if isinstance(tree, int):
        return tree
    if tree[0] == "neg":
        inner = _rearrange(tree[1], rng)
        if isinstance(inner, tuple) and inner[0] == "+" and rng.random() < 0.5:
            return ("-", _neg(inner[1]), inner[2])
        return _neg(inner) if rng.random() < 0.7 else ("neg", inner)
    op, left, right = tree
    left, right = _rearrange(left, rng), _rearrange(right, rng)
    if op in "+*" and rng.random() < 0.5:
        left, right = right, left
    roll = rng.random()
    if op in "*/":
        if roll < 0.25:
            return (op, _neg(left), _neg(right))
        if roll < 0.5:
            return _neg((op, _neg(left), right))
        if roll < 0.75:
            return _neg((op, left, _neg(right)))
    elif op == "+" and roll < 0.4:
        return ("-", left, _neg(right))
    elif op == "-" and roll < 0.3:
        return ("+", left, _neg(right))
    elif op == "-" and roll < 0.6:
        return _neg(("-", right, left))
    return (op, left, right)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_trees, st.randoms(use_true_random=False))
def test_canonical_form_is_invariant_under_sign_and_inverse_rearrangements(tree, rng):
    text = _render(tree)
    form = canonical_form(text)
    assert form is not None, text
    for _ in range(3):
        moved = _rearrange(tree, rng)
        assert _value(moved) == _value(tree)  # the rearrangement itself keeps the value
        assert canonical_form(_render(moved)) == form, (text, _render(moved))
    assert canonical_form(form) == form


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_trees)
def test_canonical_form_keeps_the_value_so_different_values_never_share_a_form(tree):
    """The form has the expression's value (so two forms that are equal have equal values) and numbers."""
    form = canonical_form(_render(tree))
    back = _tree_of(form)
    assert sorted(_leaves_of(back)) == sorted(_leaves_of(tree))
    value = _value(tree)
    if value is None:  # no value (a division by zero), never a correct answer: 2/(5/0) folds to 2*0/5
        return
    assert _value(back) == value, (_render(tree), form)
    if value.denominator == 1:
        assert score_answer(ans(form), _leaves_of(tree), int(value)) == 1.0, (_render(tree), form)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_trees, _trees)
def test_two_expressions_with_different_values_never_share_a_form(a, b):
    # Small leaves and few of them make shared forms common enough to exercise the implication.
    fa, fb = canonical_form(_render(a)), canonical_form(_render(b))
    va, vb = _value(a), _value(b)
    if fa == fb and va is not None and vb is not None:
        assert va == vb, (_render(a), _render(b), fa)


def test_every_expression_over_four_numbers_groups_by_value():
    """Exhaustively: all expressions over [2, 3, 3, 5] (with and without a sign moved): one value a form.

    Expressions that divide by zero have no value and are left out (never a correct answer)."""
    import itertools

    def trees(leaves):
        if len(leaves) == 1:
            yield leaves[0]
            return
        for cut in range(1, len(leaves)):
            for left in trees(leaves[:cut]):
                for right in trees(leaves[cut:]):
                    for op in "+-*/":
                        yield (op, left, right)

    rng = random.Random(0)
    value_of: dict[str, Fraction] = {}
    for order in set(itertools.permutations([2, 3, 3, 5])):
        for tree in trees(list(order)):
            value = _value(tree)
            if value is None:
                continue
            for variant in (tree, _rearrange(tree, rng)):
                form = canonical_form(_render(variant))
                assert value_of.setdefault(form, value) == value, (_render(variant), form)
    assert len(value_of) > 500


# ----------------------------------------------------------------------------------------------------
# Solver and generator
# ----------------------------------------------------------------------------------------------------


def test_solver_finds_known_solutions():
    sols = solve([1, 2, 3, 4], 24)
    assert sols == sorted(sols) and len(set(sols)) == len(sols)
    for expected in ["(1+2+3)*4", "1*2*3*4", "(1+3)*(2+4)"]:
        assert canonical_form(expected) in sols
    assert solve([44, 19, 35], 98) == [canonical_form("44+19+35")]
    assert solve([1, 1], 5) == []
    assert len(solve([1, 2, 3, 4], 24, limit=2)) == 2
    with pytest.raises(ValueError, match="limit"):
        solve([1, 2], 3, limit=0)


# Hand-counted instances: the solutions a person counts, each group written the ways a person might
# write it (the first of each group as the solver prints it). The groups were made by hand from the
# full list of expressions the solver finds up to commutativity and associativity alone (the old count,
# in the comment), joining those that differ only by where a sign or an inverse sits.
_HAND_COUNTED = [
    # [2, 3, 5, 7] -> 24, the example: 4 up to commutativity and associativity, 3 to a person.
    ([2, 3, 5, 7], 24, [
        ["(5-2)*7+3", "3-(2-5)*7", "3+(2-5)*(-7)", "7*(5-2)+3"],  # 7 times 3, plus 3
        ["2+3*5+7"],
        ["3*7+5-2", "5+7*3-2"],  # 21, plus 5 minus 2 (no distributivity: not the first one)
    ]),
    # [5, 5, 6, 7] -> 8: 2 before, 1 now; the sign sits in a denominator.
    ([5, 5, 6, 7], 8, [
        ["5+6/(7-5)", "5-6/(5-7)", "5+(-6)/(5-7)", "5-(-6)/(7-5)"],
    ]),
    # [1, 4, 7, 7] -> 2: 4 before, 3 now; a quotient of two differences, both turned round.
    ([1, 4, 7, 7], 2, [
        ["(7-1)/(7-4)", "(1-7)/(4-7)", "-(1-7)/(7-4)"],
        ["4-1-7/7", "4-(1+7/7)"],
        ["4/(1+7/7)"],
    ]),
    # [3, 4, 7, 7] -> 14: 6 before, 4 now; multiplying or dividing by 4-3 = 1 stay two solutions
    # (no identities), but the sign of 3-4 moved out of the product or quotient is one.
    ([3, 4, 7, 7], 14, [
        ["(4-3)*(7+7)"],
        ["(4-3)*7+7", "7-(3-4)*7"],
        ["(7+7)/(4-3)", "-(7+7)/(3-4)"],
        ["7+7/(4-3)", "7-7/(3-4)"],
    ]),
    # [4, 5, 6, 7] -> 4: 5 before, 3 now; a product of two differences, and a sign in a denominator.
    ([4, 5, 6, 7], 4, [
        ["(6-4)*(7-5)", "(4-6)*(5-7)"],
        ["6+7-4-5", "6-(4+5-7)"],
        ["6-4/(7-5)", "6+4/(5-7)"],
    ]),
    # [1, 1, 1, 5] -> 1: 4 before, 2 now; 1-1 is its own negation, so adding or subtracting
    # (1-1)*5 is one solution; multiplying or dividing by 5 stay two (no cancellation).
    ([1, 1, 1, 5], 1, [
        ["(1-1)*5+1", "1-(1-1)*5", "1+5*(1-1)"],
        ["(1-1)/5+1", "1-(1-1)/5"],
    ]),
]


@pytest.mark.parametrize("numbers, target, groups", _HAND_COUNTED)
def test_solver_counts_solutions_as_a_person_does(numbers, target, groups):
    for group in groups:
        forms = {canonical_form(text) for text in group}
        assert forms == {group[0]}, group  # every way of writing it has the form the solver prints
        for text in group:
            assert score_answer(ans(text), numbers, target) == 1.0, text
    assert solve(numbers, target) == sorted(group[0] for group in groups)
    every_writing = [ans(text) for group in groups for text in group]
    counts = distinct_correct_solutions(every_writing, numbers, target)
    assert counts == {group[0]: len(group) for group in sorted(groups)}


def test_solver_and_distinct_correct_solutions_agree():
    """solve lists each solution once, as its own canonical form; rewriting the solver's solutions
    with signs moved around never makes distinct_correct_solutions count a new one."""
    rng = random.Random(5)
    instances = generate_instances(30, seed=11, number_range=(1, 12), target_range=(1, 30))
    for inst in instances:
        sols = solve(inst.numbers, inst.target)
        assert sols and all(canonical_form(s) == s for s in sols), inst
        rewritten = [_render(_rearrange(_tree_of(s), rng)) for s in sols for _ in range(3)]
        counts = distinct_correct_solutions(sols + rewritten, inst.numbers, inst.target, extract=False)
        assert counts == {s: 4 for s in sols}, inst


def test_generated_instances_are_solvable_and_solutions_score_one():
    instances = generate_instances(40, seed=3) + generate_instances(10, seed=4, target_sampling="reachable")
    assert {len(i.numbers) for i in instances} == {3, 4}
    for inst in instances:
        assert all(1 <= v <= 100 for v in inst.numbers) and 1 <= inst.target <= 100
        sols = solve(inst.numbers, inst.target)
        assert sols, inst
        for s in sols:
            assert score_answer(ans(s), inst.numbers, inst.target) == 1.0, (inst, s)
            assert inst.score(ans(s)) == 1.0
            assert canonical_form(s) == s


def test_generator_is_seeded_and_distinct():
    a = generate_instances(50, seed=7)
    assert a == generate_instances(50, seed=7)
    assert a != generate_instances(50, seed=8)
    assert len({i.key for i in a}) == 50
    assert generate_instances(5, seed=7, num_numbers=3) == generate_instances(5, seed=7, num_numbers=[3])
    assert all(len(i.numbers) == 3 for i in generate_instances(5, seed=7, num_numbers=3))


def test_splits_share_no_instance():
    train, test = make_splits(120, 40, seed=1)
    assert len(train) == 120 and len(test) == 40
    assert not {i.key for i in train} & {i.key for i in test}
    assert (train, test) == make_splits(120, 40, seed=1)
    # exclude keeps a later draw away from an existing set
    more = generate_instances(30, seed=1, exclude=train + test)
    assert not {i.key for i in more} & {i.key for i in train + test}


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_numbers"):
        generate_instances(1, 0, num_numbers=0)
    with pytest.raises(ValueError, match="target_range"):
        generate_instances(1, 0, target_range=(5, 1))
    with pytest.raises(ValueError, match="target_sampling"):
        generate_instances(1, 0, target_sampling="uniform")
    with pytest.raises(ValueError, match="widen"):
        generate_instances(5, 0, num_numbers=3, number_range=(1, 1), target_range=(1, 3))


# ----------------------------------------------------------------------------------------------------
# Prompt and environment
# ----------------------------------------------------------------------------------------------------


def test_prompt_follows_the_public_layout():
    text = make_prompt([44, 19, 35], 98)
    assert "[44, 19, 35]" in text and "98" in text and "<answer>" in text
    assert text.startswith("A conversation between User and Assistant")
    assert text.endswith("Assistant: Let me solve this step by step.\n<think>")
    chat = make_prompt((44, 19, 35), 98, chat=True)
    assert [m["role"] for m in chat] == ["system", "user"]
    assert "[44, 19, 35]" in chat[1]["content"]


def test_check_env_passes():
    check_env(gym.make("setpo/Countdown-v0").unwrapped)
    check_env(CountdownEnv(generate_instances(5, seed=0)), skip_render_check=True)  # no spec, no render modes


def test_env_reset_is_seeded_and_step_scores():
    env = CountdownEnv(n_instances=20, instance_seed=2)
    obs1, info1 = env.reset(seed=11)
    obs2, info2 = env.reset(seed=11)
    assert obs1 == obs2 and info1 == info2
    assert [env.reset(seed=s)[1]["index"] for s in range(30)] == [env.reset(seed=s)[1]["index"] for s in range(30)]
    obs, info = env.reset(options={"index": 3})
    inst = env.instances[3]
    assert info == {"numbers": list(inst.numbers), "target": inst.target, "index": 3}
    assert obs == make_prompt(inst.numbers, inst.target)
    completion = f" ... </think> <answer>{solve(inst.numbers, inst.target)[0]}</answer>"
    obs, reward, terminated, truncated, info = env.step(completion)
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(completion)
    env.reset(seed=0)
    assert env.step("no answer")[1] == 0.0
    env.reset(seed=0)
    with pytest.raises(ValueError, match="str"):
        env.step(3)
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 20})


# ----------------------------------------------------------------------------------------------------
# Parquet
# ----------------------------------------------------------------------------------------------------


def test_parquet_trl_round_trip(tmp_path):
    instances = generate_instances(6, seed=5)
    df = pd.read_parquet(export_parquet(instances, tmp_path / "trl.parquet"))
    assert list(df.columns) == ["prompt", "numbers", "target"]
    for row, inst in zip(df.itertuples(), instances, strict=True):
        assert row.prompt == make_prompt(inst.numbers, inst.target)
        assert tuple(row.numbers) == inst.numbers and row.target == inst.target
    chat = pd.read_parquet(export_parquet(instances, tmp_path / "chat.parquet", chat=True))
    assert [dict(m) for m in chat.prompt[0]] == make_prompt(instances[0].numbers, instances[0].target, chat=True)


def test_trl_reward_scores_text_and_conversational_batches():
    numbers, target = [[44, 19, 35], [1, 2]], [98, 3]
    texts = ["<answer>44+19+35</answer>", "<answer>1*2</answer>"]
    assert countdown_reward(texts, numbers, target, prompts=["p", "q"]) == [1.0, 0.1]
    chats = [[{"role": "assistant", "content": t}] for t in texts]
    assert countdown_reward(completions=chats, numbers=numbers, target=target) == [1.0, 0.1]
    with pytest.raises(ValueError, match="lengths"):
        countdown_reward(texts, numbers[:1], target)


def test_parquet_trl_loads_with_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    instances = generate_instances(3, seed=5)
    path = export_parquet(instances, tmp_path / "chat.parquet", chat=True)
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert ds[0]["prompt"] == make_prompt(instances[0].numbers, instances[0].target, chat=True)
    assert ds[0]["numbers"] == list(instances[0].numbers)


def test_parquet_verl_round_trip_and_score(tmp_path):
    instances = generate_instances(4, seed=6)
    df = pd.read_parquet(export_parquet(instances, tmp_path / "verl.parquet", style="verl", split="test"))
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for i, (row, inst) in enumerate(zip(df.itertuples(), instances, strict=True)):
        assert row.data_source == "countdown" and row.ability == "math"
        assert [dict(m) for m in row.prompt] == make_prompt(inst.numbers, inst.target, chat=True)
        assert row.reward_model["style"] == "rule"
        truth = row.reward_model["ground_truth"]
        assert tuple(truth["numbers"]) == inst.numbers and truth["target"] == inst.target
        assert row.extra_info["split"] == "test" and row.extra_info["index"] == i
        good = f"<answer>{solve(inst.numbers, inst.target)[0]}</answer>"
        assert verl_compute_score(row.data_source, good, truth, row.extra_info) == 1.0
        assert verl_compute_score(row.data_source, "<answer>1</answer>", truth) == 0.1
    base = pd.read_parquet(export_parquet(instances, tmp_path / "base.parquet", style="verl", chat=False))
    assert [dict(m) for m in base.prompt[0]] == [{"role": "user", "content": make_prompt(instances[0].numbers, instances[0].target)}]
    with pytest.raises(ValueError, match="style"):
        export_parquet(instances, tmp_path / "x.parquet", style="openrlhf")


def test_load_countdown_tasks_by_path(tmp_path):
    folder = tmp_path / "countdown" / "data"
    folder.mkdir(parents=True)
    rows = pd.DataFrame({"target": [98, 24, 7], "nums": [[44, 19, 35], [1, 2, 3, 4], [3, 4]]})
    rows.to_parquet(folder / "train-00000-of-00001.parquet")
    tasks = load_countdown_tasks(folder / "train-00000-of-00001.parquet")
    assert tasks == [CountdownInstance((44, 19, 35), 98), CountdownInstance((1, 2, 3, 4), 24), CountdownInstance((3, 4), 7)]
    assert load_countdown_tasks(tmp_path / "countdown") == tasks  # a folder is searched for *.parquet
    assert load_countdown_tasks(folder, limit=2) == tasks[:2]
    with pytest.raises(FileNotFoundError, match="Countdown-Tasks-3to4"):
        load_countdown_tasks(tmp_path / "missing.parquet")
    pd.DataFrame({"numbers": [[1]], "target": [1]}).to_parquet(tmp_path / "wrong.parquet")
    with pytest.raises(ValueError, match="nums"):
        load_countdown_tasks(tmp_path / "wrong.parquet")
