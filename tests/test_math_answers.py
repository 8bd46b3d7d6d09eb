"""The final answer of a response and its reward, on the formats real models write: the first 20
responses of SmolLM2-135M-Instruct on GSM8K test (results/math/real_responses.md) never box an answer; they state
it ("The final answer is 20.", "So, the answer is 18 years."). Each case below is a format seen there or one of
the usual GSM8K decorations (currency, thousands separators, units, a trailing period, a percent sign)."""

from __future__ import annotations

import pytest

from setpo.envs.math_answers import final_answer, math_reward, normalize_answer


@pytest.mark.parametrize("text, answer", [
    ("Therefore, Janet makes 20 dollars per day. The final answer is 20.", "20"),
    ("8 * 2 = 16 bolts. Therefore, the answer is 16.", "16"),
    ("So, the answer is 18 years.", "18"),
    ("The final answer is: **42**", "42"),
    ("Answer: $1,200.", "1200"),
    ("The answer is \\$1,200.50 in total.", "1200.50"),
    ("#### 72", "72"),
    ("the answer is -4", "-4"),
    ("I think the answer is 3, no wait, the answer is 5.", "5"),   # the last statement wins
    ("so the answer is 7 but \\boxed{9}", "9"),                   # a box wins over a statement
    ("\\boxed{18 dollars}", "18"), ("\\boxed{18.}", "18"), ("\\boxed{18\\%}", "18"), ("\\boxed{1\\,200}", "1200"),
    ("\\boxed{\\$1,200}", "1200"), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("so $2\\sqrt{13}$", "2\\sqrt{13}"), ("thus \\(x = 3\\)", "x = 3"),
])
def test_final_answer_reads_the_formats_models_write(text, answer):
    assert final_answer(text) == answer


@pytest.mark.parametrize("text", [
    "the net profit is $80,000 - $50,000 = $15,000. This is the profit made by Josh.",  # currency, not LaTeX
    "So, 80 / 2 = 40 cups of feed are needed",           # a last number, but nothing stated
    "the answer is 2 * 4 = 8",                           # an expression, not its first number
    "To find the answer, 3 * 4 = 12",
    "",
])
def test_no_stated_answer_is_none(text):
    assert final_answer(text) is None
    assert math_reward(text, "15000") == 0.0


@pytest.mark.parametrize("text, gold, reward", [
    ("The final answer is 20.", "20", 1.0), ("The final answer is 20.", "18", 0.0),
    ("So, the answer is 18 years.", "18", 1.0), ("Answer: $1,200.", "1200", 1.0),
    ("The answer is 1,200", "1,200", 1.0), ("#### 18", "Janet sells 9 eggs.\n#### 18", 1.0),
    ("\\boxed{18 dollars}", "18", 1.0), ("\\boxed{18\\%}", "18", 1.0), ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("The answer is 7 apples", "8", 0.0),
])
def test_math_reward_on_stated_and_decorated_answers(text, gold, reward):
    assert math_reward(text, gold) == reward


def test_normalize_answer_leaves_non_numbers_alone():
    assert normalize_answer(" 1,234,567 ") == "1234567"
    assert normalize_answer("12,34") == "12,34"  # not a thousands pattern: left to math-verify
    assert normalize_answer("x^2 + 1") == "x^2 + 1"
    assert normalize_answer("\\frac{3}{4}.") == "\\frac{3}{4}"


def test_a_long_response_without_an_answer_is_scored_quickly():
    import time

    text = "the answer is " + "1 + " * 20000 + "1"
    t0 = time.perf_counter()
    assert math_reward(text, "7") == 0.0
    assert time.perf_counter() - t0 < 2.0


def test_the_committed_table_of_real_responses_is_what_the_checker_says_now():
    """results/math/real_responses.md is the checker's verdict on kept real responses: a change to the checker
    must come with the table made again (``python -m setpo_lab run math_responses``, which rescores the kept
    responses without sampling)."""
    import json
    from pathlib import Path

    from setpo_lab.studies import math_responses

    folder = Path(__file__).resolve().parent.parent / "results" / "math"
    kept = json.loads((folder / "real_responses.json").read_text())
    rows, table = math_responses._score_table(kept["responses"], kept["settings"]["n"])
    assert len(rows) == 20 and table in (folder / "real_responses.md").read_text()
    assert sum(r["extracted"] != "—" for r in rows) >= 8  # stated answers are read
