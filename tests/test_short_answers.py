"""The short-answer task family (setpo.envs.short_answers) and the base-model table's arithmetic."""

import pytest

from setpo.envs.short_answers import (EXAMPLES, KINDS, MAX_DIGITS, SPLITS, answer_key, parse_answer, right_answer,
                                      sample_tasks, score_answer, split_of, task_from_id, task_messages, tasks_of,
                                      text_after_answer, to_trl_records)
from setpo.trl.rewards import short_answer_reward
from setpo_lab.studies import short_answers
from setpo_lab.studies.short_answers import BaseTableConfig


def test_splits_are_disjoint_by_prompt_and_cover_every_kind():
    for kind in KINDS:
        seen = {split: {t.question for t in tasks_of(kind, split)} for split in SPLITS}
        assert all(seen.values()), kind
        assert not (seen["train"] & seen["val"] or seen["train"] & seen["test"] or seen["val"] & seen["test"])
        for split, questions in seen.items():
            assert all(split_of(q) == split for q in questions)
        assert EXAMPLES[kind][0] not in set().union(*seen.values())  # the worked example is never asked


def test_right_answers_and_task_ids_round_trip():
    for kind in KINDS:
        for task in tasks_of(kind, "val")[:20]:
            assert task_from_id(task.task_id) == task
            rights = [v for v in range(-5, 2000) if task.is_right(v)]
            assert len(rights) == task.right_answers >= 1
            assert (task.right_answers > 1) == task.many_answers
    t = task_from_id("add_2x1:23:4")
    assert t.question == "What is 23 + 4?" and t.is_right(27) and not t.is_right(28)
    m = task_from_id("multiple:5:12:45")
    assert [v for v in range(100) if m.is_right(v)] == [15, 20, 25, 30, 35, 40, 45]


@pytest.mark.parametrize("bad", ["", "between", "between:1", "between:10:20:30", "nope:1:2", "between:a:b",
                                 "between:10:" + "9" * 5000, "between:1:2", "add_2x1:23:-4", 17, None])
def test_malformed_task_ids_are_refused(bad):
    with pytest.raises(ValueError):
        task_from_id(bad)


@pytest.mark.parametrize("text, value", [
    ("Answer: 42", 42), ("answer:42.", 42), ("  Answer: -3  \nmore text", -3), ("ANSWER : +7", 7),
    ("", None), ("42", None), ("Answer:", None), ("Answer: 4 2", None), ("Answer: 3 + 4", None),
    ("Answer: forty", None), ("The answer is 5", None), ("Answer: 1e5", None), ("Answer: 3.5", None),
    ("Answer: " + "9" * MAX_DIGITS, int("9" * MAX_DIGITS)), ("Answer: " + "9" * 100_000, None),
    ("\n\nAnswer: 5", 5), ("x\nAnswer: 5", None), (None, None), (b"Answer: 5", None), (["Answer: 5"], None),
])
def test_parse_answer_reads_only_one_answer_line(text, value):
    assert parse_answer(text) == value


@pytest.mark.parametrize("text, after", [
    ("Answer: 5", ""), ("Answer: 5\n", ""), ("  \nAnswer: 5\n \n", ""),
    ("Answer: 5\n\nQuestion: 2 + 2?", "Question: 2 + 2?"), ("no answer\nAnswer: 5", "Answer: 5"), ("", ""),
    (None, ""), (b"Answer: 5\nx", ""), ("Answer: 5\n" + "x" * 10_000, "x" * 10_000),
])
def test_text_after_answer_is_what_the_checker_never_reads(text, after):
    assert text_after_answer(text) == after


def test_score_and_reward_function():
    task = task_from_id("between:10:28")
    assert score_answer("Answer: 10", task) == 1.0 and score_answer("Answer: 29", task) == 0.0
    assert right_answer("Answer: 12", task) == 12 and right_answer("Answer: 2", task) is None
    rows = to_trl_records([task, task_from_id("add_1x1:1:1")])
    assert rows[0]["prompt"] == task_messages(task) and rows[0]["prompt"][-1]["content"] == task.question
    completions = [[{"role": "assistant", "content": "Answer: 11"}], "Answer: 2"]
    assert short_answer_reward(completions, task_id=[r["task_id"] for r in rows]) == [1.0, 1.0]
    # a chat content given as text blocks is read as the package's other rewards read it (it once scored 0)
    blocks = [[{"role": "assistant", "content": [{"type": "text", "text": "Answer: 11"}]}]]
    assert short_answer_reward(blocks, task_id=[rows[0]["task_id"]]) == [1.0]
    with pytest.raises(ValueError, match="task_id"):
        short_answer_reward(["Answer: 1"])
    with pytest.raises(ValueError):
        short_answer_reward(["Answer: 1"], task_id=["between:1:1"])


@pytest.mark.parametrize("text, key", [("Answer: 30", "30"), ("answer: 030.\nmore", "30"), ("Answer: -4", "-4"),
                                       ("30", None), ("", None), (None, None)])
def test_answer_key_is_the_parsed_answer_as_text(text, key):
    assert answer_key(text) == key


def test_sample_tasks_is_reproducible_and_bounded():
    a = sample_tasks(KINDS, "train", 3, seed=1)
    assert a == sample_tasks(KINDS, "train", 3, seed=1) != sample_tasks(KINDS, "train", 3, seed=2)
    assert [t.kind for t in a] == [k for k in KINDS for _ in range(3)]
    with pytest.raises(ValueError, match="only"):
        sample_tasks(["add_1x1"], "val", 1000)
    with pytest.raises(ValueError, match="kind"):
        sample_tasks(["bogus"], "train", 1)
    with pytest.raises(ValueError, match="split"):
        tasks_of("between", "dev")


def test_mixed_share_and_kind_row():
    assert short_answers._mixed_share(16, 0, 8) == 0.0 and short_answers._mixed_share(16, 16, 8) == 0.0
    assert short_answers._mixed_share(16, 1, 8) == pytest.approx(0.5)  # the one right sample is drawn half the time
    with pytest.raises(ValueError):
        short_answers._mixed_share(4, 1, 8)
    cfg = BaseTableConfig(n=4, group_size=2, max_new_tokens=5)
    tasks = [task_from_id("between:10:28"), task_from_id("add_1x1:1:1")]
    samples = [["Answer: 11", "Answer: 11", "Answer: 12", "no"], ["Answer: 2", "Answer: 3", "x", "y"]]
    row = short_answers._kind_row(tasks, samples, [[3, 3, 3, 5], [3, 3, 1, 1]], cfg)
    assert row["reward"] == 4 / 8 and row["distinct_right"] == (2 + 1) / 2
    assert row["answer_line"] == 5 / 8 and row["truncated"] == 1 / 8


def test_kinds_given_as_one_string_say_how_to_write_them():
    from setpo_lab.studies.short_answers_config import BaseTableConfig, ShortAnswerStudyConfig

    with pytest.raises(ValueError, match=r"got the string 'between'; write kinds=\('between',\)"):
        ShortAnswerStudyConfig(kinds="between")
    with pytest.raises(ValueError, match="got the string"):
        BaseTableConfig(kinds="add_1x1")
    with pytest.raises(ValueError, match=r"got the string 'between'; write \['between'\]"):
        sample_tasks("between", "train", 2)


def test_hard_kinds_ask_bigger_sums_and_products():
    for kind, shape in (("add_3x2", (3, 2)), ("add_3x3", (3, 3)), ("times_2x1", (2, 1)), ("times_2x2", (2, 2))):
        tasks = tasks_of(kind, "test")
        assert len(tasks) >= 40  # room for a pass@k test set of 40+ prompts in one kind
        for t in tasks[:10]:
            assert tuple(len(str(x)) for x in t.operands) == shape and t.right_answers == 1
            assert score_answer(f"Answer: {t.low}", t) == 1.0 and t.question.startswith("What is ")


def test_untrained_many_answer_kinds_are_right_exactly_where_their_question_says():
    """odd, ends_in and above: every right answer and only those, read off the question's own words."""
    import re

    from setpo.envs.short_answers import STUDY_KINDS, UNTRAINED_MANY_ANSWER_KINDS, tasks_of

    assert not set(UNTRAINED_MANY_ANSWER_KINDS) & set(STUDY_KINDS)  # never in a training pool
    for kind in UNTRAINED_MANY_ANSWER_KINDS:
        for task in tasks_of(kind, "test")[:40]:
            nums = [int(x) for x in re.findall(r"\d+", task.question)]
            if kind == "odd":
                want = {v for v in range(nums[0], nums[1] + 1) if v % 2 == 1}
            elif kind == "ends_in":
                want = {v for v in range(nums[0], nums[1] + 1) if v % 10 == nums[2]}
            else:
                want = set(range(nums[0] + 1, nums[1]))
            got = {v for v in range(-5, 200) if task.is_right(v)}
            assert got == want and task.right_answers == len(want) >= 3 and task.many_answers, task.question
            assert score_answer(f"Answer: {min(want)}", task) == 1.0
            assert score_answer(f"Answer: {max(want) + 1}", task) == 0.0


@pytest.mark.parametrize("field, value, match", [
    ("seeds", (True,), "seeds must be distinct whole numbers"), ("seeds", (-1,), "seeds must be distinct whole"),
    ("save_steps", True, "save_steps must be a whole number"), ("eval_seed", -5, "eval_seed must be a whole number"),
    ("max_new_tokens", 10**8, "max_new_tokens must be at most"), ("lam_units", "bogus", "lam_units must be one of"),
    ("bf16", "yes", "bf16 must be true or false"), ("lam", "0.5", "lam must be a positive finite number"),
    ("lr", float("nan"), "lr must be a positive finite number"), ("temperature", 0, "temperature must be a positive"),
    ("embedder", "no_such_model", "embedder: 'no_such_model'"), ("model_path", "", "model_path must be a folder")])
def test_the_study_config_refuses_what_a_run_would_fail_on_later(field, value, match):
    """Each was taken by the config and failed only when the first run used it (a RuntimeError from torch for a
    bool seed or a 10^8-token budget, an allocation of 460 GB), after config.json was written: the rerun with the
    value fixed was then refused as another configuration's folder."""
    from setpo_lab.studies.short_answers_config import ShortAnswerStudyConfig

    with pytest.raises(ValueError, match=match):
        ShortAnswerStudyConfig(**{field: value})


def test_a_missing_base_model_is_refused_before_a_folder_is_claimed(tmp_path):
    from setpo_lab.studies import short_answers
    from setpo_lab.studies.short_answers import run_study
    from setpo_lab.studies.short_answers_config import BaseTableConfig, ShortAnswerStudyConfig

    missing = str(tmp_path / "no_model")
    with pytest.raises(ValueError, match="no model folder"):
        run_study(ShortAnswerStudyConfig.preset("smoke", run_dir=str(tmp_path / "study"), model_path=missing))
    with pytest.raises(ValueError, match="no model folder"):
        short_answers._base_table(BaseTableConfig(model_path=missing), tmp_path / "base")
    assert not (tmp_path / "study").exists() and not (tmp_path / "base").exists()
