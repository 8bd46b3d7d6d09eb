"""Hostile and malformed input to the library's embedders, readers, metrics and environments: refused by name
(a ValueError or FileNotFoundError that says what is wrong), never a NaN, a traceback from deep inside, or a hang.
Each test fails without the fix it names; valid input is checked elsewhere to be unchanged."""

import subprocess
import sys
import textwrap

import pytest
import torch

from setpo.embed import HashedNgramEmbedder, default_embedder, is_named_embedder, load_embedder, one_hot_keys
from setpo.envs import short_answers as sa
from setpo.envs.countdown import CountdownEnv, CountdownInstance, generate_instances, score_answer, solve
from setpo.envs.math_answers import (MAX_EXPANDED_TERMS, MAX_POWER_DIGITS, answer_too_costly, clean_answer,
                                     math_reward, normalize_answer)
from setpo.metrics import diversity_width_and_average_modes, mode_coverage, pass_at_k
from setpo.reads import ExploitMonitor, kernel_texts, read_answers, unread_text

# ------------------------------------------------------------------------------------------- embedders


def test_a_folder_without_a_model_is_one_line_that_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no sentence-transformers model") as err:
        load_embedder(str(tmp_path))
    assert "\n" not in str(err.value)


def test_hash_embedder_takes_lone_surrogates():
    """A lone surrogate (legal in a str read from JSON) was a UnicodeEncodeError deep inside the hash."""
    out = HashedNgramEmbedder(dim=16)(["\ud800", "a\udfffb"])
    assert out.shape == (2, 16) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("spec", ["hash:" + "9" * 5000])
def test_a_huge_hash_size_is_named(spec):
    with pytest.raises(ValueError, match="hash buckets"):
        load_embedder(spec)


def test_embedder_helpers_check_their_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        default_embedder(batch_size=[1])
    with pytest.raises(ValueError, match="keys"):
        one_hot_keys("abc")
    with pytest.raises(ValueError, match="keys"):
        one_hot_keys(None)
    assert is_named_embedder(None) is False


# ------------------------------------------------------------------------------------------- reads


def reader(text):
    return sa.answer_key(text)


@pytest.mark.parametrize("call, match", [
    (lambda: read_answers("Answer: 3", reader), "single str"),
    (lambda: read_answers(None, reader), "sequence of strings"),
    (lambda: read_answers(["Answer: 3"], "setpo.envs.short_answers:answer_key"), "reader"),
    (lambda: kernel_texts("Answer: 3", "completion", None), "single str"),
    (lambda: kernel_texts([None], "completion", None), "must all be str"),
    (lambda: kernel_texts(["Answer: 3"], "Completion", reader), "kernel_reads"),
    (lambda: unread_text(None, "3"), "unread_text"),
    (lambda: unread_text("Answer: 3", 3), "unread_text"),
])
def test_what_the_kernel_reads_is_checked(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("change, match", [
    (dict(lam="0.1"), "lam"), (dict(lam=float("nan")), "lam"), (dict(kernel_reads="bogus"), "kernel_reads"),
    (dict(in_sets=[0.5, 0.5, 0.5]), "in_sets"), (dict(s=[0.0, 1.0, 2.0]), "torch tensor"),
    (dict(texts="abc", answers=["1", "2", "3"]), "single str"),
    (dict(texts=["a", "b", "c"], answers=["1", "2"]), "2 answers"),
])
def test_the_monitor_checks_each_batch(change, match):
    args = dict(s=torch.arange(3.0), lengths=[1, 2, 3], in_sets=[True] * 3, answers=None, texts=None, lam=0.1,
                kernel_reads="completion")
    args.update(change)
    with pytest.raises(ValueError, match=match):
        ExploitMonitor(window=1).observe(**args)


# ------------------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("n", [10**300, 10**5000, 1e300], ids=["10**300", "10**5000", "1e300"])
def test_pass_at_k_refuses_n_beyond_int64(n):
    with pytest.raises(ValueError, match="2\\*\\*63"):
        pass_at_k(n, 5000, 5000)
    assert pass_at_k(2**63 - 1, 3, 2) == pytest.approx(0.0, abs=1e-17)


@pytest.mark.parametrize("kwargs, match", [
    (dict(weights=["1", "2"]), "real numbers"), (dict(weights=[None, 1.0]), "real numbers"),
    (dict(weights=[1j, 1.0]), "real numbers"), (dict(weights=[1e308, 1e308]), "float range"),
    (dict(modes=[[0], [1]]), "hashable"), (dict(correct_modes=[[0]]), "hashable"),
])
def test_mode_coverage_checks_weights_and_ids(kwargs, match):
    args = dict(modes=[0, 1], correct_modes=[0])
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mode_coverage(**args)


@pytest.mark.parametrize("counts, min_distinct, match", ids=["inf", "nan", "None", "10**400"], argvalues=[
    ([1, 2], float("inf"), "min_distinct"), ([1, 2], float("nan"), "min_distinct"), ([1, 2], None, "min_distinct"),
    ([10**400, 1], 2, "2\\*\\*53"),
])
def test_diversity_width_checks_its_numbers(counts, min_distinct, match):
    with pytest.raises(ValueError, match=match):
        diversity_width_and_average_modes(counts, min_distinct=min_distinct)


# ------------------------------------------------------------------------------------------- math answers


COSTLY = {
    "\\boxed{(9999^{9999})^{9999}}": "digits", "\\boxed{{10^{9999}}^{9999}}": "digits",
    "\\boxed{\\sqrt{9^{9999}}^{9999}}": "digits", "\\boxed{\\frac{1}{9^{9999}}^{9999}}": "digits",
    "\\boxed{" + "9999^{9999}\\cdot" * 60 + "1}": "digits", "\\boxed{" + "9" * 990 + "^{9999}}": "digits",
    "\\boxed{(x+y+z)^{99}}": "terms", "\\boxed{((x+1)^{99})^{99}}": "terms", "\\boxed{(a+b+c+d)^{20}}": "terms",
    "\\boxed{" + "(x+1)^{99}" * 10 + "}": "terms",
}


@pytest.mark.parametrize("text", list(COSTLY))
def test_powers_too_big_together_are_refused_before_parsing(text):
    """Each ran past 30 s in a worker thread (or 10 s for the 990-digit base) before; now refused as text."""
    why = answer_too_costly(text[len("\\boxed{"):-1])
    assert why and COSTLY[text] in why and str(MAX_POWER_DIGITS if COSTLY[text] == "digits"
                                                 else MAX_EXPANDED_TERMS) in why


def test_costly_powers_score_zero_fast_in_a_thread():
    code = textwrap.dedent(f"""
        import threading, time
        from setpo.envs.math_answers import math_reward
        math_reward("\\\\boxed{{1}}", "1")
        texts = {list(COSTLY)!r}
        done = []
        def run():
            for t in texts:
                done.append(math_reward(t, "42"))
        th = threading.Thread(target=run); th.start(); th.join()
        assert done == [0.0] * len(texts), done
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_small_powers_of_powers_still_score():
    assert answer_too_costly("(2^{3})^{2}") is None and answer_too_costly("(x^{2}+1)^{2}") is None
    assert math_reward("\\boxed{(2^{3})^{2}}", "64") == 1.0
    assert math_reward("\\boxed{" + "9999^{9999}\\cdot" * 2 + "1}", "42") == 0.0


@pytest.mark.parametrize("call, match", [
    (lambda: clean_answer(None), "number or text"), (lambda: clean_answer([1]), "number or text"),
    (lambda: clean_answer(10**5000), "bits"), (lambda: math_reward("\\boxed{1}", [1]), "number or text"),
    (lambda: math_reward("\\boxed{1}", "1", timeout=0.5), "timeout"),
    (lambda: math_reward("\\boxed{1}", "1", timeout=-1), "timeout"),
    (lambda: math_reward("\\boxed{1}", "1", timeout="5"), "timeout"),
    (lambda: normalize_answer(None), "str"), (lambda: answer_too_costly(None), "str"),
    (lambda: answer_too_costly("1", max_chars="5"), "max_chars"),
])
def test_math_answer_helpers_check_their_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------- environments


@pytest.mark.parametrize("call, match", [
    (lambda: solve(list(range(1, 9)), 10), "at most 6 numbers"),
    (lambda: solve([1, 2, 3], 6, limit=float("nan")), "limit"),
    (lambda: solve([1, 2, 3], 6, limit=float("inf")), "limit"),
    (lambda: score_answer("<answer>1+2+3</answer>", [1, 2, 3], "6"), "target"),
    (lambda: generate_instances(1, 0, number_range=(0, 10**30)), "number_range"),
    (lambda: generate_instances(1, 0, exclude=None), "exclude"),
    (lambda: generate_instances(1, 0, exclude=["ab"]), "exclude"),
    (lambda: CountdownEnv(instances=[CountdownInstance("ab", None)]), "instances\\[0\\]"),
])
def test_countdown_checks_its_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: sa.score_answer("Answer: 3", "between:1:5"), "task_from_id"),
    (lambda: sa.right_answer("Answer: 3", None), "TaskSpec"),
    (lambda: sa.task_messages("between:10:20"), "TaskSpec"),
    (lambda: sa.to_trl_records("abc"), "tasks"),
    (lambda: sa.split_of(None), "question"),
    (lambda: sa.sample_tasks(None, "train", 1), "kinds"),
    (lambda: sa.TaskSpec("multiple", 1, 10, 0), "step"),
    (lambda: sa.TaskSpec("nope", 1, 10), "unknown task kind"),
    (lambda: sa.TaskSpec("between", 10, 1), "low <= high"),
    (lambda: sa.TaskSpec("between", 1.5, 10), "low"),
])
def test_short_answers_check_their_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("spec", ["builtins:eval", "builtins:exec", "os:system", "subprocess:run", "ast:literal_eval",
                                  "pickle:loads", "os.path:exists"])
def test_an_answer_reader_named_by_text_never_runs_model_output(spec):
    """A reader is called on model output: one that evaluates text or reaches the system is refused by name."""
    from setpo.embed import resolve_reader

    with pytest.raises(ValueError, match="called on model output"):
        resolve_reader(spec)
    assert resolve_reader("setpo.envs.short_answers:answer_key") is not None  # a parser of our own still resolves
