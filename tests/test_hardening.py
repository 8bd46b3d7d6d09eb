"""Hostile inputs, the rest: the verl Countdown scorer's ground truth, every reset option and step
action of both gymnasium environments, the embedders' constructor arguments, the reward adapters' columns.
Each bad input is a ValueError whose one line names the argument (or key) and what it accepts; each good one
still works."""

import math
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import setpo.envs  # noqa: F401  (registers the ids)
from setpo.envs.bandit import BanditConfig, MultiModalBandit, MultiModalBanditEnv
from setpo.envs.countdown import CountdownEnv, CountdownInstance, generate_instances, make_splits, verl_compute_score
from setpo.embed import CenteredEmbedder, HashedNgramEmbedder, SentenceTransformerEmbedder, TableEmbedder, load_embedder

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# Values a caller might pass where a whole number is expected: the space the env checks must cover.
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1.5, -0.0, 3.0, 1e300]),
    st.text(max_size=4), st.binary(max_size=4), st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from([np.int64(2), np.float64(2.0), np.float64(np.nan), np.uint8(1), np.bool_(True), np.array(1),
                     Fraction(1, 2), Fraction(4, 2), 1 + 0j, {"a": 1}, object()]),
)


def _as_whole(value, n):
    """The index ``value`` should select among n, or None when it must be refused."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, (str, bytes, list, dict, complex)):
        return None
    if isinstance(value, np.ndarray):
        value = value[()]
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f) or f != int(f) or not 0 <= int(f) < n or (isinstance(value, Fraction)
                                                                        and value.denominator != 1):
        return None
    return int(f) if not isinstance(value, int) else value


# ------------------------------------------------------------------------------ item 2: verl ground truth


@pytest.mark.parametrize("truth, named", [
    ({"nums": [1], "target": 1}, ["'numbers'", "'nums'"]),
    ({"numbers": [1]}, ["'target'"]),
    ({}, ["'numbers'", "'target'"]),
    ({"answer": "1"}, ["'numbers'", "'answer'"]),
])
def test_verl_ground_truth_without_the_keys_names_needed_and_received(truth, named):
    with pytest.raises(ValueError, match="ground_truth") as err:
        verl_compute_score("countdown", "<answer>1</answer>", truth)
    text = _one_line(err)
    assert all(n in text for n in named), text


@pytest.mark.parametrize("truth, match", [
    (None, "mapping"), ("numbers=1,target=1", "mapping"), ([1, 1], "mapping"), (3, "mapping"),
    ({"numbers": "12", "target": 3}, "numbers"), ({"numbers": 5, "target": 5}, "numbers"),
    ({"numbers": [1, 2], "target": float("nan")}, "target"), ({"numbers": [1.5], "target": 1}, "numbers"),
])
def test_verl_ground_truth_of_the_wrong_shape_is_named(truth, match):
    with pytest.raises(ValueError, match=match) as err:
        verl_compute_score("countdown", "<answer>1</answer>", truth)
    _one_line(err)


def test_verl_ground_truth_as_verl_reads_it_from_parquet_still_scores():
    truth = {"numbers": np.array([3, 4]), "target": np.int64(7)}  # what a parquet round trip gives
    assert verl_compute_score("countdown", "<answer>3+4</answer>", truth) == 1.0
    assert verl_compute_score("countdown", "<answer>3*4</answer>", {"numbers": [3, 4], "target": 7}) == 0.1


@given(st.sets(st.sampled_from(["numbers", "target", "nums", "answer", "ground_truth"]), max_size=4))
@FAST
def test_verl_ground_truth_keys_property(keys):
    truth = {k: 1 if k == "target" else [1] for k in keys}
    if {"numbers", "target"} <= truth.keys():
        assert verl_compute_score("countdown", "<answer>1</answer>", truth) == 1.0
        return
    with pytest.raises(ValueError, match="ground_truth keys") as err:
        verl_compute_score("countdown", "<answer>1</answer>", truth)
    assert str(sorted(truth)) in _one_line(err)


# ------------------------------------------------------------------------------ item 3: gymnasium envs


ENVS = {
    "countdown": (lambda: CountdownEnv(generate_instances(5, seed=0)), "index", 5),
    "bandit": (lambda: MultiModalBanditEnv(num_prompts=3), "prompt", 3),
}


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("value", [None, float("inf"), float("-inf"), float("nan"), -1, 2.5, True, "1", [1],
                                   10**30, np.float64(np.nan), 1 + 0j])
def test_reset_option_out_of_its_range_is_named(name, value):
    make, key, n = ENVS[name]
    env = make()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=rf"options\['{key}'\].*\[0, {n}\)") as err:
        env.reset(seed=0, options={key: value})
    _one_line(err)


@pytest.mark.parametrize("name", ENVS)
@given(value=ODD_VALUES)
@FAST
def test_reset_option_property(name, value):
    """Every value either selects that problem (whole numbers in range, in any numeric type) or is refused
    naming the option and its range."""
    make, key, n = ENVS[name]
    env = make()
    want = _as_whole(value, n)
    if want is None:
        with pytest.raises(ValueError, match=rf"options\['{key}'\] must be a whole number in \[0, {n}\)") as err:
            env.reset(options={key: value})
        _one_line(err)
        return
    obs, info = env.reset(options={key: value})
    assert (info["index"] if name == "countdown" else obs) == want


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("seed, options, match", [
    (-1, None, "seed"), (1.5, None, "seed"), (True, None, "seed"), ("0", None, "seed"), (float("nan"), None, "seed"),
    (0, "index=1", "options must be None or a dict"), (0, [("index", 1)], "options must be None or a dict"),
    (0, {"indx": 1}, "unknown key"), (0, {"seed": 1}, "unknown key"),
])
def test_reset_seed_and_options_are_checked(name, seed, options, match):
    env = ENVS[name][0]()
    with pytest.raises(ValueError, match=match) as err:
        env.reset(seed=seed, options=options)
    _one_line(err)


@pytest.mark.parametrize("name", ENVS)
def test_a_refused_reset_changes_nothing_and_good_resets_still_work(name):
    make, key, n = ENVS[name]
    env, twin = make(), make()
    first = env.reset(seed=4)
    twin.reset(seed=4)
    with pytest.raises(ValueError):
        env.reset(seed=-3)
    with pytest.raises(ValueError):
        env.reset(seed=9, options={key: n})
    # the generator was not reseeded by the refused calls: both continue identically
    assert str(env.reset()) == str(twin.reset())
    assert str(env.reset(seed=np.int64(4))) == str(first)  # numpy integer seeds are fine
    assert str(env.reset(seed=4, options={})) == str(first) and str(env.reset(seed=4, options=None)) == str(first)


@pytest.mark.parametrize("action", [None, 3, 3.5, float("nan"), b"<answer>1</answer>", ["<answer>"], True,
                                    {"text": "x"}, np.array(["x"])])
def test_countdown_step_refuses_what_is_not_text(action):
    env = CountdownEnv(generate_instances(5, seed=0))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be the completion text, a str") as err:
        env.step(action)
    _one_line(err)
    assert env.step("no answer")[1] == 0.0  # a refused action ends nothing


BANDIT_ACTIONS = st.one_of(
    ODD_VALUES,
    st.permutations([True, 1, 2]), st.permutations([np.bool_(False), 1, 2]),  # numpy casts mixed bools to ints
    st.lists(ODD_VALUES, min_size=3, max_size=3),
    st.lists(st.integers(-3, 8), min_size=0, max_size=5),
    st.lists(st.one_of(st.floats(-1, 7), st.sampled_from([float("nan"), float("inf")])), min_size=3, max_size=3),
)


@given(action=BANDIT_ACTIONS)
@FAST
def test_bandit_step_property(action):
    """Three whole numbers in [0, vocab_size) (any numeric types) are a trajectory; anything else is refused
    with one line naming the action and the token range, and ends nothing."""
    env = MultiModalBanditEnv()
    env.reset(seed=0)
    vocab = env.world.config.vocab_size
    ids = None
    if isinstance(action, list) and len(action) == 3:
        ids = [_as_whole(a, vocab) for a in action]
        if any(i is None for i in ids) or any(isinstance(a, Fraction) for a in action):
            ids = None
    if ids is None:
        with pytest.raises(ValueError, match=rf"action must be 3 whole-number token ids in \[0, {vocab}\)") as err:
            env.step(action)
        _one_line(err)
        env.step([0, 0, 0])
        return
    _, reward, terminated, _, info = env.step(action)
    assert terminated and info["mode"] == int(env.world.modes([0], [ids])[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_prompt_chars=0), "max_prompt_chars"), (dict(max_prompt_chars=None), "max_prompt_chars"),
    (dict(max_completion_chars=float("inf")), "max_completion_chars"), (dict(max_completion_chars=-5), "max_comp"),
    (dict(n_instances=None), "n must be"), (dict(n_instances=float("inf")), "n must be"),
    (dict(instance_seed=-1), "seed"), (dict(instance_seed=None), "seed"), (dict(num_numbers=None), "num_numbers"),
    (dict(num_numbers="34"), "num_numbers"), (dict(num_numbers=float("nan")), "num_numbers"),
    (dict(instances="abc"), "instances"), (dict(instances=[3]), r"instances\[0\]"),
    (dict(instances=[((1, 2), 3), ((1, 2),)]), r"instances\[1\]"), (dict(instances=[(("a",), 3)]), r"instances\[0\]"),
    (dict(instances=[]), "at least one"),
])
def test_countdown_env_constructor_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        CountdownEnv(**{"n_instances": 5, **kwargs})
    _one_line(err)


def test_countdown_generators_check_counts():
    for call in (lambda: make_splits(None, 3, 0), lambda: make_splits(3, float("inf"), 0),
                 lambda: generate_instances(2, 1.5), lambda: generate_instances(True, 0)):
        with pytest.raises(ValueError, match="must be a whole number"):
            call()
    env = CountdownEnv(instances=[((3, 4), 7), CountdownInstance((1, 2), 3)])  # pairs and instances both fine
    assert env.reset(options={"index": 0})[1]["target"] == 7


@pytest.mark.parametrize("kwargs, match", [
    (dict(config={"num_modes": 3}), "BanditConfig"), (dict(num_mode=3), "no field.*num_mode"),
])
def test_bandit_env_constructor_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        MultiModalBanditEnv(**kwargs)
    _one_line(err)
    with pytest.raises(ValueError, match="BanditConfig"):
        MultiModalBandit("paper")


def test_bandit_env_overrides_apply_to_a_given_config():
    env = MultiModalBanditEnv(BanditConfig(num_prompts=2), num_prompts=4)  # overrides were ignored before
    assert env.world.config.num_prompts == 4 and env.observation_space.n == 4


def test_check_env_still_passes_on_both():
    check_env(gym.make("setpo/MultiModalBandit-v0").unwrapped)
    check_env(gym.make("setpo/Countdown-v0").unwrapped)


# ------------------------------------------------------------------------------ item 4: embedders


@pytest.mark.parametrize("table, match", [
    ({"a": [1.0, 0.0], "b": [1.0]}, r"table\['b'\] has 1 values but table\['a'\] has 2"),
    ({"a": [1.0, float("nan")]}, r"table\['a'\] has non-finite"),
    ({"a": [1.0, 0.0], "b": [float("inf"), 0.0]}, r"table\['b'\] has non-finite"),
    ({"a": [1.0], "b": [1e300]}, r"table\['b'\] has non-finite.*float32"),
    ({"a": [1.0], "b": []}, r"table\['b'\] is empty"),
    ({"a": [0.0, 0.0]}, r"table\['a'\] is the zero vector"),
    ({"a": [1.0], "b": [1e-60]}, r"table\['b'\] is the zero vector"),
    ({"a": [[1.0, 0.0]]}, r"table\['a'\] must be a 1-D vector"),
    ({"a": 1.0}, r"table\['a'\] must be a 1-D vector"),
    ({"a": "10"}, r"table\['a'\] must be a vector"),
    ({"a": None}, r"table\['a'\] must be a vector"),
    ({"a": [True, False]}, r"table\['a'\] must be a vector of real numbers"),
    ({"a": [1 + 1j]}, r"table\['a'\] must be a vector of real numbers"),
    ({"a": [[1.0], [1.0, 2.0]]}, r"table\['a'\] must be a vector"),
    ({"a": torch.ones(2, dtype=torch.bool)}, r"table\['a'\] must be a real-valued"),
    ({"a": torch.empty(2, device="meta")}, r"table\['a'\] must be a real-valued"),
    ({1: [1.0]}, r"table key 1 is a int"),
    ({}, "table is empty"),
    ([("a", [1.0])], "table must be a mapping"),
])
def test_table_embedder_checks_its_table_when_built(table, match):
    with pytest.raises(ValueError, match=match) as err:
        TableEmbedder(table)
    _one_line(err)


@given(st.dictionaries(st.text(max_size=3), st.lists(st.floats(width=32), min_size=0, max_size=4), min_size=1,
                       max_size=5))
@FAST
def test_table_embedder_property(table):
    """A table is accepted exactly when every vector is finite, non-zero and of one length; then each text
    embeds to its vector."""
    lengths = {len(v) for v in table.values()}
    good = (len(lengths) == 1 and 0 not in lengths
            and all(all(math.isfinite(x) for x in v) and any(x != 0 for x in v) for v in table.values()))
    if not good:
        with pytest.raises(ValueError, match=r"table\[") as err:
            TableEmbedder(table)
        _one_line(err)
        return
    emb = TableEmbedder(table)
    keys = list(table)
    assert torch.equal(emb(keys), torch.tensor([table[k] for k in keys], dtype=torch.float32))


@pytest.mark.parametrize("make, match", [
    (lambda: HashedNgramEmbedder(dim=10**12), "dim=1000000000000 is over"),
    (lambda: load_embedder("hash:99999999"), "is over"),
    (lambda: load_embedder("hash:"), "integer"),
    (lambda: load_embedder("hash:-4"), "integer"),
    (lambda: load_embedder("hash", device="gpu"), "device"),
    (lambda: HashedNgramEmbedder(ngram="13"), "ngram"),
    (lambda: HashedNgramEmbedder(ngram=(1, 2, 3)), "ngram"),
    (lambda: HashedNgramEmbedder(ngram=None), "ngram"),
    (lambda: HashedNgramEmbedder(dim=True), "dim"),
    (lambda: CenteredEmbedder("hash", ["a", "b"]), "base must be an embedder"),
    (lambda: CenteredEmbedder(HashedNgramEmbedder(8), ["a", "a"]), "one distinct text"),
    (lambda: CenteredEmbedder(HashedNgramEmbedder(8), "ab"), "single str"),
    (lambda: CenteredEmbedder(lambda texts: torch.ones(3), ["a", "b"]), r"base returned \(3,\)"),
    (lambda: CenteredEmbedder(lambda texts: [[1.0]] * 2, ["a", "b"]), "base returned list"),
    (lambda: CenteredEmbedder(lambda texts: torch.full((2, 2), float("nan")), ["a", "b"]), "non-finite"),
    (lambda: SentenceTransformerEmbedder("/nonexistent-model", normalize="no"), "normalize"),
])
def test_other_embedders_check_their_arguments(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make()
    _one_line(err)


@pytest.mark.parametrize("texts", [None, 5, b"ab", {"a": 1}])
def test_embedders_name_texts_that_are_not_a_sequence(texts):
    for emb in (HashedNgramEmbedder(8), TableEmbedder({"a": [1.0]})):
        with pytest.raises(ValueError, match="texts must be a sequence of strings") as err:
            emb(texts)
        _one_line(err)


def test_hashed_embedder_with_a_huge_ngram_is_fast_and_unchanged():
    """ngram=(1, 10**9) looped a billion times per text before (a hang); run in a subprocess with a timeout so
    that a regression fails instead of hanging the suite."""
    import subprocess
    import sys

    code = ("import torch; from setpo.embed import HashedNgramEmbedder as H; t = ['', 'a', '(3+4)*5', 'é' * 40]; "
            "assert torch.equal(H(dim=64, ngram=(1, 10**9))(t), H(dim=64, ngram=(1, 100))(t)); "
            "assert H(dim=64, ngram=(50, 60))(['ab']).nonzero().shape == (1, 2); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# ------------------------------------------------------------------------------ the TRL reward adapters


def test_reward_adapters_name_a_missing_dataset_column():
    from setpo.trl.rewards import countdown_reward, math_reward_func

    with pytest.raises(ValueError, match=r"countdown_reward needs the dataset column\(s\) \['numbers'\].*'nums'"):
        countdown_reward(["<answer>1</answer>"], nums=[[1]], target=[1], prompts=["p"])
    with pytest.raises(ValueError, match=r"math_reward_func needs the dataset column\(s\) \['answer'\]"):
        math_reward_func(["\\boxed{1}"], solution=["1"])
    assert countdown_reward(["<answer>1</answer>"], numbers=[[1]], target=[1]) == [1.0]


# ------------------------------------------------------------------------------ the other entry points


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_prompts=None), "n_prompts"), (dict(n_prompts=2.5), "n_prompts"), (dict(n_responses=1), "n_responses"),
    (dict(feature_dim=True), "feature_dim"), (dict(quality_scale=float("nan")), "quality_scale"),
    (dict(taste_scale=float("inf")), "taste_scale"), (dict(taste_scale=float("nan")), "taste_scale"),
    (dict(expert_noise=float("nan")), "expert_noise"), (dict(ambiguous_fraction=None), "ambiguous_fraction"),
    (dict(grader_noise=(0.1, float("inf"))), r"grader_noise\[1\]"), (dict(grader_noise=(0.1, -1)), "grader_noise"),
    (dict(grader_noise="ab"), "grader_noise"), (dict(slip_prob=(0.1, float("nan"))), r"slip_prob\[1\]"),
    (dict(slip_prob=(0.1,)), "slip_prob"), (dict(grader_noise=(0.1, None)), r"grader_noise\[1\]"),
])
def test_rubric_config_checks_every_field(kwargs, match):
    from setpo.envs.rubric import RubricToyConfig

    with pytest.raises(ValueError, match=match) as err:
        RubricToyConfig(**kwargs)
    _one_line(err)


def test_rubric_task_checks_seed_config_and_times():
    from setpo.envs.rubric import RubricTask, RubricToyConfig

    for call, match in ((lambda: RubricTask(seed=-1), "seed"), (lambda: RubricTask(seed=1.5), "seed"),
                        (lambda: RubricTask({"n_prompts": 3}), "RubricToyConfig")):
        with pytest.raises(ValueError, match=match):
            call()
    task = RubricTask(RubricToyConfig(n_prompts=4, n_responses=3), seed=0)
    idx, gen = torch.tensor([0, 1]), torch.Generator().manual_seed(0)
    for times in (None, float("inf"), float("nan"), 0, 1.5, "2"):
        with pytest.raises(ValueError, match="times must be a positive integer"):
            task.regrade(idx, idx, times, gen)
    assert task.regrade(idx, idx, 2.0, gen).shape == (2, 2, 2)


def test_math_loaders_and_command_line_check_their_arguments(tmp_path, capsys):
    import setpo.envs.math as md

    train, _ = md.write_smoke_files(tmp_path / "data", n_train=3, n_val=2)
    for limit in (2.5, True, "3", float("nan"), 0):
        with pytest.raises(ValueError, match="limit"):
            md.load_math_problems(train, limit=limit)
    assert len(md.load_math_problems(train, limit=2.0)) == 2
    for n in (None, 2.5, 0, float("inf")):
        with pytest.raises(ValueError, match="n must be"):
            md.smoke_problems(n)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        md.write_smoke_files(tmp_path / "a_file", n_train=2, n_val=2)
    with pytest.raises(ValueError, match="n must be"):
        md.write_smoke_files(tmp_path / "never", n_train=0)
    assert not (tmp_path / "never").exists()  # checked before anything is written
    for argv, match in ((["smoke", str(tmp_path / "x"), "--n-train", "0"], "--n-train"),
                        (["prepare", str(tmp_path / "missing.jsonl"), str(tmp_path / "o.parquet")], "no math data"),
                        (["prepare", str(train), str(tmp_path)], "not a folder")):
        with pytest.raises(SystemExit) as e:
            md.main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and match in err, err


def test_countdown_data_functions_check_their_arguments(tmp_path):
    from setpo.envs.countdown import distinct_correct_solutions, export_parquet, load_countdown_tasks

    inst = generate_instances(2, seed=0)
    for kwargs, match in ((dict(chat="no"), "chat"), (dict(chat=1), "chat"), (dict(split=""), "split"),
                          (dict(data_source=None), "data_source"), (dict(style="csv"), "style")):
        with pytest.raises(ValueError, match=match):
            export_parquet(inst, tmp_path / "x.parquet", **kwargs)
    with pytest.raises(ValueError, match="is a folder"):
        export_parquet(inst, tmp_path)
    with pytest.raises(ValueError, match="instances must be"):
        export_parquet(5, tmp_path / "x.parquet")
    import pandas as pd

    pd.DataFrame({"nums": [[1, 2]], "target": [3]}).to_parquet(tmp_path / "tasks.parquet")
    for limit in ("1", 1.5, float("nan"), -1):
        with pytest.raises(ValueError, match="limit"):
            load_countdown_tasks(tmp_path / "tasks.parquet", limit=limit)
    assert load_countdown_tasks(tmp_path / "tasks.parquet", limit=1.0)[0].target == 3
    with pytest.raises(ValueError, match="answers must be a sequence"):
        distinct_correct_solutions(5, [1, 2], 3)


def test_probe_callback_checks_its_period(tmp_path):
    from setpo.trl.training import probe_callback

    for every in (0, -1, 1.5, None, float("nan")):
        with pytest.raises(ValueError, match="every"):
            probe_callback(lambda model, step: [], tmp_path / "p.jsonl", every)
    with pytest.raises(ValueError, match="sample must be a callable"):
        probe_callback("sampler", tmp_path / "p.jsonl", 2)


def test_progress_callback_checks_its_period():
    from setpo.trl.training import progress_callback

    for every_s in (float("nan"), -1.0, None, "10"):
        with pytest.raises(ValueError, match="every_s"):
            progress_callback(print, "rl", every_s)
    with pytest.raises(ValueError, match="log must be a callable"):
        progress_callback("stdout", "rl")
    progress_callback(print, "rl", 0)  # every log line
