"""The verl plug-in: verl's own compute_advantage with adv_estimator="setpo", the trainer hook, the launcher's
configuration composed and validated by verl's config system for every preset, and the plug-in in Ray workers."""

import sys
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage  # noqa: E402

import setpo
import setpo.verl as sv
from setpo.embed import HashedNgramEmbedder, TextKeyEmbedder
from setpo.presets import PRESETS
from setpo.reads import unread_text
from setpo.verl.estimator import session_layout, verl_setpo_advantages
from setpo.verl.trainer import session_texts


def _ragged_batch(seed=0, sizes=(3, 5, 4, 6), length=7, dim=16):
    """A DataProto as verl's trainer hands it over: shuffled uids of unequal group sizes, ragged response
    lengths, the outcome reward on each response's last token."""
    rng = np.random.default_rng(seed)
    uids = np.repeat(np.array([f"uid-{i}" for i in range(len(sizes))], dtype=object), sizes)
    uids = uids[rng.permutation(len(uids))]
    n = len(uids)
    lengths = rng.integers(2, length + 1, size=n)
    mask = (torch.arange(length)[None, :] < torch.as_tensor(lengths)[:, None]).float()
    rewards = torch.as_tensor(rng.choice([0.0, 1.0], size=n), dtype=torch.float32)
    token_rewards = torch.zeros(n, length)
    token_rewards[torch.arange(n), torch.as_tensor(lengths) - 1] = rewards
    emb = rng.normal(size=(n, dim)).astype(np.float32)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={"uid": uids, sv.EMBEDDINGS_KEY: emb},
    )
    return data, rewards, torch.as_tensor(emb), uids, mask


def _algo_config(lam=0.05, **extra):
    return OmegaConf.create({"adv_estimator": "setpo", "setpo": {"lam": lam, **extra}})


def test_setpo_is_registered_in_verls_registry():
    assert core_algos.get_adv_estimator_fn("setpo") is sv.compute_setpo_outcome_advantage


@pytest.mark.parametrize("lam", [0.05, 0.5])
def test_verls_compute_advantage_equals_setpo_advantages(lam):
    data, rewards, emb, uids, mask = _ragged_batch()
    expected = setpo.setpo_advantages(rewards, emb, uids, lam=lam)
    cfg = _algo_config(lam)
    # verl's own compute_advantage, dispatching through its registry, with the embeddings supplied by the context
    with sv.batch_embeddings(emb, uids=uids):
        out = verl_compute_advantage(data, adv_estimator="setpo", config=cfg)
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)
    torch.testing.assert_close(out.batch["returns"], expected[:, None] * mask)
    # the wrapper reads data.non_tensor_batch["setpo_embeddings"] itself
    data2, *_ = _ragged_batch()
    out2 = sv.compute_advantage(data2, adv_estimator="setpo", config=cfg)
    torch.testing.assert_close(out2.batch["advantages"], expected[:, None] * mask)
    # the diversity term really is there: λ·s moves the advantages away from plain GRPO
    assert not torch.allclose(expected, setpo.group_advantages(rewards, uids), atol=1e-4)


def test_lambda_zero_is_verls_own_grpo():
    data, *_ = _ragged_batch(seed=1)
    grpo = verl_compute_advantage(_ragged_batch(seed=1)[0], adv_estimator="grpo")
    out = sv.compute_advantage(data, config=_algo_config(0.0))
    torch.testing.assert_close(out.batch["advantages"], grpo.batch["advantages"], atol=1e-6, rtol=1e-5)


def test_texts_in_the_batch_are_embedded_by_the_configured_embedder():
    data, rewards, _, uids, mask = _ragged_batch(seed=2)
    texts = np.array([f"response {i % 5} {'x' * (i % 3)}" for i in range(len(uids))], dtype=object)
    del data.non_tensor_batch[sv.EMBEDDINGS_KEY]
    data.non_tensor_batch[sv.TEXTS_KEY] = texts
    out = sv.compute_advantage(data, config=_algo_config(0.1, embedding_model="hash", embedding_device="cpu"))
    expected = setpo.setpo_advantages(rewards, HashedNgramEmbedder()(list(texts)), uids, lam=0.1)
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)


def test_responses_decoded_by_a_tokenizer():
    data, rewards, _, uids, mask = _ragged_batch(seed=3)
    del data.non_tensor_batch[sv.EMBEDDINGS_KEY]
    data.batch["responses"] = torch.arange(len(uids))[:, None].repeat(1, 3) % 4

    class Tok:
        def batch_decode(self, ids, skip_special_tokens=True):
            return [" ".join(f"w{int(t)}" for t in row) for row in ids]

    emb = HashedNgramEmbedder()
    out = sv.compute_advantage(data, config=_algo_config(0.2), embedder=emb, tokenizer=Tok())
    expected = setpo.setpo_advantages(rewards, emb(Tok().batch_decode(data.batch["responses"])), uids, lam=0.2)
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)


def test_missing_or_misaligned_embeddings_are_errors():
    data, _, emb, uids, _ = _ragged_batch()
    cfg = _algo_config()
    with pytest.raises(ValueError, match="found no response embeddings"):
        verl_compute_advantage(data, adv_estimator="setpo", config=cfg)
    with pytest.raises(ValueError, match="not in the batch's order"):
        with sv.batch_embeddings(emb, uids=uids[::-1]):
            verl_compute_advantage(data, adv_estimator="setpo", config=cfg)
    with pytest.raises(ValueError, match="rows but the batch has"):
        with sv.batch_embeddings(emb[:-1]):
            verl_compute_advantage(data, adv_estimator="setpo", config=cfg)
    with pytest.raises(ValueError, match="algorithm.setpo section"):
        sv.compute_advantage(data, config=OmegaConf.create({"adv_estimator": "setpo"}))
    with pytest.raises(ValueError, match="unknown keys"):
        sv.compute_advantage(data, config=_algo_config(lamda=1.0))
    del data.non_tensor_batch[sv.EMBEDDINGS_KEY]
    with pytest.raises(ValueError, match="neither"):
        sv.compute_advantage(data, config=cfg)


def test_groups_smaller_than_three_get_no_marginal_and_verls_singleton_convention():
    # a dropped session leaves a group of 2 (or 1): no leave-one-out marginal there, training goes on
    data, rewards, emb, uids, mask = _ragged_batch(sizes=(3, 2, 1, 4))
    out = sv.compute_advantage(data, config=_algo_config(0.5))
    grpo = verl_compute_advantage(_ragged_batch(sizes=(3, 2, 1, 4))[0], adv_estimator="grpo")
    big = np.isin(uids, ["uid-0", "uid-3"])
    small = torch.as_tensor(~big)
    torch.testing.assert_close(out.batch["advantages"][small], grpo.batch["advantages"][small])
    assert not torch.allclose(out.batch["advantages"][~small], grpo.batch["advantages"][~small], atol=1e-4)
    with sv.batch_embeddings(emb, uids=uids) as record:
        verl_compute_advantage(_ragged_batch(sizes=(3, 2, 1, 4))[0], adv_estimator="setpo", config=_algo_config(0.5))
    assert record.stats["setpo/groups_without_marginal"] == 2


def test_ratio_metric_is_nan_not_huge_when_every_group_is_flat():
    # a random policy often scores a whole batch the same: Ā = 0 everywhere, and |λs|/|Ā| has no meaning
    n, t = 6, 3
    emb = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    uids = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    with sv.batch_embeddings(emb, uids=uids) as record:
        core_algos.get_adv_estimator_fn("setpo")(torch.zeros(n, t), torch.ones(n, t), index=uids,
                                                 config=_algo_config(0.5))
    assert np.isnan(record.stats["setpo/lambda_s_over_adv"])
    assert record.stats["setpo/s_std"] > 0  # the marginals themselves are there


# --------------------------------------------------------------------------------- the v1 trainer hook


class _FakeNested:
    def __init__(self, rows):
        self.rows = rows

    def to_padded_tensor(self, padding):
        width = max(len(r) for r in self.rows)
        return torch.tensor([r + [padding] * (width - len(r)) for r in self.rows])


class _FakeObjects(list):
    def tolist(self):
        return list(self)


class _FakeTokenizer:
    pad_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(f"t{int(t)}" for t in row if not (skip_special_tokens and int(t) == 0)) for row in ids]


def _fake_transfer_queue(store):
    tq = types.ModuleType("transfer_queue")

    def kv_batch_get(keys, partition_id, select_fields):
        rows = [store[k] for k in keys]
        out = {}
        if "uid" in select_fields:
            out["uid"] = _FakeObjects(r["uid"] for r in rows)
        if "responses" in select_fields:
            out["responses"] = _FakeNested([r["responses"] for r in rows])
        return out

    tq.kv_batch_get = kv_batch_get
    return tq


class _FakeVerlTrainer:
    """Stands in for verl's v1 PPOTrainer: its _compute_advantage builds the DataProto from the store in key
    order and calls verl's compute_advantage, as verl's does (for non-GRPO estimators)."""

    def __init__(self, store, config):
        self.store, self.config, self.tokenizer = store, config, _FakeTokenizer()

    def _compute_advantage(self, batch, metrics):
        rows = [self.store[k] for k in batch.keys]
        data = DataProto.from_dict(
            tensors={"token_level_rewards": torch.stack([r["token_level_rewards"] for r in rows]),
                     "response_mask": torch.stack([r["response_mask"] for r in rows])},
            non_tensors={"uid": np.array([r["uid"] for r in rows], dtype=object)})
        self.result = verl_compute_advantage(data, adv_estimator=self.config.algorithm.adv_estimator,
                                             config=self.config.algorithm)
        return batch


def test_trainer_hook_embeds_the_decoded_responses_and_logs(monkeypatch):
    rng = np.random.default_rng(5)
    sizes, length = (3, 4, 5), 6
    uids = np.repeat([f"u{i}" for i in range(len(sizes))], sizes)[rng.permutation(sum(sizes))]
    store, keys = {}, []
    for i, u in enumerate(uids):
        n_tok = int(rng.integers(1, length + 1))
        reward = float(rng.integers(0, 2))
        tr = torch.zeros(length)
        tr[n_tok - 1] = reward
        key = f"{u}_{i}_0"  # verl v1: {uid}_{session_id}_{index}; one output per session
        keys.append(key)
        store[key] = {"uid": str(u), "responses": [int(t) for t in rng.integers(1, 6, size=n_tok)],
                      "token_level_rewards": tr, "response_mask": (torch.arange(length) < n_tok).float()}
    monkeypatch.setitem(sys.modules, "transfer_queue", _fake_transfer_queue(store))
    config = OmegaConf.create({"algorithm": {"adv_estimator": "setpo",
                                             "setpo": {"lam": 0.3, "embedding_model": "hash",
                                                       "embedding_device": "cpu"}}})
    trainer = sv.setpo_trainer_class(_FakeVerlTrainer)(store, config)
    metrics = {}
    trainer._compute_advantage(types.SimpleNamespace(keys=keys, partition_id="train"), metrics)

    texts = _FakeTokenizer().batch_decode(_FakeNested([store[k]["responses"] for k in keys]).to_padded_tensor(0))
    rewards = torch.stack([store[k]["token_level_rewards"].sum() for k in keys])
    mask = torch.stack([store[k]["response_mask"] for k in keys])
    expected = setpo.setpo_advantages(rewards, HashedNgramEmbedder()(texts), uids, lam=0.3)
    torch.testing.assert_close(trainer.result.batch["advantages"], expected[:, None] * mask)
    assert {"setpo/embed_time_s", "setpo/s_mean", "setpo/s_std", "setpo/lambda_s_over_adv"} <= set(metrics)
    assert metrics["setpo/lambda_s_over_adv"] > 0


def test_trainer_hook_passes_other_estimators_through(monkeypatch):
    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # importing it would fail: the hook must not try
    calls = []

    class Base:
        config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}})

        def _compute_advantage(self, batch, metrics):
            calls.append(batch)
            return batch

    assert sv.setpo_trainer_class(Base)()._compute_advantage("b", {}) == "b" and calls == ["b"]


def test_trainer_lookup_returns_setpo_subclass_of_verls_choice(monkeypatch):
    class Sync:
        pass

    fake_v1 = types.ModuleType("verl.trainer.ppo.v1")
    fake_v1.get_trainer_cls = lambda name: {"sync": Sync}[name]
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.v1", fake_v1)
    original = fake_v1.get_trainer_cls
    with sv.setpo_trainers_selected():
        cls = fake_v1.get_trainer_cls("sync")
        assert issubclass(cls, Sync) and issubclass(cls, sv.SetPOTrainerMixin)
        assert fake_v1.get_trainer_cls("sync") is cls  # one subclass per base
    assert fake_v1.get_trainer_cls is original


def test_importing_the_plugin_hooks_verls_trainer_lookup_when_verl_imports_it():
    """verl's own main_ppo trains SetPO given VERL_USE_EXTERNAL_MODULES=setpo.verl: importing the plug-in hooks
    verl's trainer lookup, without importing verl's trainer module itself (its engines ask for the device platform
    at import, before a platform plug-in listed after setpo.verl has registered it). A fresh interpreter: this
    process has long imported both."""
    import subprocess

    code = """
import sys, setpo.verl
assert "verl.trainer.ppo.v1" not in sys.modules
from verl.trainer.ppo.v1 import get_trainer_cls  # what verl's TaskRunnerV1.run does
from setpo.verl import SetPOTrainerMixin, install_trainer_hook
cls = get_trainer_cls("sync")
assert issubclass(cls, SetPOTrainerMixin) and cls.__mro__[2].__name__ == "PPOTrainerSync", cls.__mro__
install_trainer_hook()  # idempotent: no second wrapper, no class with the mixin twice
import verl.trainer.ppo.v1 as v1
assert v1.get_trainer_cls("sync") is cls
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    assert sv.setpo_trainer_class(sv.setpo_trainer_class(object)) is sv.setpo_trainer_class(object)


# --------------------------------------------------------------------------------- launcher configuration


def _launch(**kw):
    base = dict(model_path="/models/Qwen2.5-Math-1.5B", train_files=["/data/gsm8k/train.parquet"],
                val_files=["/data/gsm8k/test.parquet", "/data/math500/test.parquet"],
                embedding_model="/models/Qwen3 Embedding")
    return sv.VerlLaunchConfig(**{**base, **kw})


def test_beta_zero_turns_the_kl_loss_and_the_reference_model_off():
    from verl.trainer.ppo.utils import need_reference_policy

    with_kl = sv.compose_config(sv.build_overrides(_launch()))
    without = sv.compose_config(sv.build_overrides(_launch(kl_coef=0.0)))
    assert need_reference_policy(with_kl) and not need_reference_policy(without)  # verl's own test of the role
    assert not without.actor_rollout_ref.actor.use_kl_loss and not without.algorithm.use_kl_in_reward
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        _launch(kl_coef=-1e-4)
    from setpo.verl.launch import build_parser

    args = build_parser().parse_args(["train", "--model-path", "m", "--train-file", "a", "--val-file", "b",
                                      "--kl-coef", "0"])
    assert args.kl_coef == 0.0


@pytest.mark.parametrize("algo", ["grpo", "gspo", "dapo"])
def test_launcher_config_is_accepted_by_verls_config_system(algo):
    from verl.utils.config import omega_conf_to_dataclass

    preset = PRESETS[algo]
    config = sv.compose_config(sv.build_overrides(_launch(algo=algo, nnodes=2, n_gpus_per_node=4)))
    sv.validate(config)  # verl's validate_config plus the setpo section
    resolved = OmegaConf.to_container(config, resolve=True)  # every interpolation resolves
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # the dataclass verl's workers build
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)

    assert actor.policy_loss.loss_mode == {"token": "vanilla", "sequence": "gspo"}[preset.ratio_level]
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (preset.clip_low, preset.clip_high)
    assert actor.loss_agg_mode == preset.loss_agg and actor.optim.lr == preset.lr
    assert actor.use_kl_loss and actor.kl_loss_coef == 1e-4 and actor.kl_loss_type == "low_var_kl"
    assert config.algorithm.filter_groups.enable == preset.dynamic_sampling
    assert config.algorithm.adv_estimator == "setpo"
    assert sv.SetPOVerlSettings.from_algorithm_config(config.algorithm).lam == preset.lam
    assert config.algorithm.setpo.embedding_model == "/models/Qwen3 Embedding"
    # the paper's math settings
    assert (rollout.n, rollout.temperature, config.data.max_response_length) == (6, 0.9, 756)
    assert (config.data.train_batch_size, config.trainer.total_epochs) == (64, 2)
    assert (rollout.val_kwargs.temperature, rollout.val_kwargs.top_p, rollout.val_kwargs.do_sample) == (0.5, 0.9, True)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (2, 4)
    assert resolved["data"]["val_files"] == ["/data/gsm8k/test.parquet", "/data/math500/test.parquet"]
    assert resolved["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == "setpo.verl"
    assert config.reward.custom_reward_function.path == "pkg://setpo.envs.math"


def test_baseline_and_lambda_override():
    config = sv.compose_config(sv.build_overrides(_launch(algo="gspo", setpo=False)))
    sv.validate(config)
    assert config.algorithm.adv_estimator == "grpo" and "setpo" not in config.algorithm
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    assert sv.build_overrides(_launch(lam=0.7)).count("+algorithm.setpo.lam=0.7") == 1
    legacy = sv.compose_config(sv.build_overrides(_launch()) + ["trainer.use_v1=false"])
    with pytest.raises(ValueError, match="use_v1"):
        sv.validate(legacy)
    with pytest.raises(ValueError, match="at least 3 rollouts"):
        _launch(rollout_n=2)
    with pytest.raises(ValueError, match="unknown algorithm preset"):
        _launch(algo="ppo")


def test_cli_print_config_converts_raw_files_and_checks_paths(tmp_path, capsys):
    from setpo.envs import math as math_data

    train, val = math_data.write_smoke_files(tmp_path / "data", n_train=8, n_val=4)
    model = tmp_path / "model"
    model.mkdir()
    argv = ["print-config", "--model-path", str(model), "--train-file", str(train), "--val-file", str(val),
            "--algo", "dapo", "--n-gpus-per-node", "2", "--output-dir", str(tmp_path / "runs"),
            "trainer.save_freq=7"]
    sv.main(argv)
    printed = capsys.readouterr().out.splitlines()
    assert "trainer.save_freq=7" in printed and "+algorithm.setpo.lam=0.2" in printed
    converted = tmp_path / "data" / "setpo_verl" / "train.parquet"  # the launcher keeps one split name
    assert math_data.is_verl_parquet(converted)
    assert f"data.train_files=[{converted}]" in printed
    with pytest.raises(FileNotFoundError, match="MODEL_PATH"):
        sv.main(["print-config", "--model-path", str(tmp_path / "none"), "--train-file", str(train),
                 "--val-file", str(val)])
    with pytest.raises(FileNotFoundError, match="EMBEDDING_MODEL_PATH"):
        sv.main(argv[:-1] + ["--embedding-model", str(tmp_path / "no-embedder")])
    with pytest.raises(FileNotFoundError, match="no data file"):
        sv.main(["print-config", "--model-path", str(model), "--train-file", str(tmp_path / "x.parquet"),
                 "--val-file", str(val)])


# --------------------------------------------------------------------------------- Ray


@pytest.mark.slow
def test_plugin_reaches_every_ray_worker_through_the_launchers_runtime_env():
    ray = pytest.importorskip("ray")
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    # Probes are defined here, not at module level, so that Ray ships them by value: the worker must not
    # import this test module (or setpo) to run them; the plug-in has to arrive through verl's own import.
    def probe_registry():
        import os
        import sys

        from verl.trainer.ppo import core_algos as ca

        return ("setpo" in ca.ADV_ESTIMATOR_REGISTRY, os.environ.get("VERL_USE_EXTERNAL_MODULES"),
                "setpo.verl" in sys.modules)

    def probe_task_runner(runner):
        from verl.trainer.ppo import core_algos as ca

        return [c.__name__ for c in type(runner).__mro__], "setpo" in ca.ADV_ESTIMATOR_REGISTRY

    config = sv.compose_config(sv.build_overrides(_launch()))
    # exactly how verl's run_ppo builds ray.init's runtime_env from the config
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env)
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=OmegaConf.to_container(runtime_env))
    try:
        registered, env, loaded = ray.get(ray.remote(num_cpus=0)(probe_registry).remote())
        assert (registered, env, loaded) == (True, "setpo.verl", True)
        runner = sv.setpo_task_runner().remote()
        mro, registered = ray.get(runner.__ray_call__.remote(probe_task_runner))
        assert "TaskRunnerV1" in mro and registered
    finally:
        ray.shutdown()


def test_run_setpo_sh_dry_run_composes_the_papers_config(tmp_path):
    """The launcher script end to end up to (not including) training: env vars -> python -m setpo.verl."""
    import os
    import subprocess
    from pathlib import Path

    from setpo.envs import math as math_data

    root = Path(__file__).resolve().parent.parent
    train, val = math_data.write_smoke_files(tmp_path / "data", n_train=8, n_val=4)
    (tmp_path / "model").mkdir()
    env = {**os.environ, "MODEL_PATH": str(tmp_path / "model"), "EMBEDDING_MODEL_PATH": "default",
           "TRAIN_FILE": str(train), "VAL_FILE": f"{val},{val}", "PYTHON_BIN": sys.executable,
           "NNODES": "2", "N_GPUS_PER_NODE": "4", "ALGO": "gspo", "SETPO_LAMBDA": "0.3", "DRY_RUN": "1",
           "OUTPUT_DIR": str(tmp_path / "runs")}
    res = subprocess.run(["bash", str(root / "scripts" / "run_setpo.sh"), "trainer.test_freq=5"], env=env,
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    for expected in ["+algorithm.setpo.lam=0.3", "trainer.nnodes=2", "trainer.n_gpus_per_node=4",
                     "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.rollout.n=6",
                     "trainer.test_freq=5", "+algorithm.setpo.embedding_model=default"]:
        assert expected in lines
    missing = subprocess.run(["bash", str(root / "scripts" / "run_setpo.sh")],
                             env={k: v for k, v in env.items() if k != "MODEL_PATH"}, capture_output=True, text=True)
    assert missing.returncode != 0 and "set MODEL_PATH" in missing.stderr


# --------------------------------------------------------------------------------- verl's GRPO flags and sessions


@pytest.mark.parametrize("norm", [True, False])
def test_lambda_zero_honours_norm_adv_by_std_in_grpo(norm):
    grpo = verl_compute_advantage(_ragged_batch(seed=3)[0], adv_estimator="grpo", norm_adv_by_std_in_grpo=norm)
    # the flag as verl's compute_advantage argument (the wrapper forwards it) ...
    out = sv.compute_advantage(_ragged_batch(seed=3)[0], config=_algo_config(0.0), norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(out.batch["advantages"], grpo.batch["advantages"], atol=1e-6, rtol=1e-5)
    # ... and as the algorithm config key verl's v1 trainer reads
    cfg = OmegaConf.create({"adv_estimator": "setpo", "norm_adv_by_std_in_grpo": norm, "setpo": {"lam": 0.0}})
    out = sv.compute_advantage(_ragged_batch(seed=3)[0], config=cfg)
    torch.testing.assert_close(out.batch["advantages"], grpo.batch["advantages"], atol=1e-6, rtol=1e-5)
    # λ > 0 adds λ·s to that same base
    data, rewards, emb, uids, mask = _ragged_batch(seed=3)
    out = sv.compute_advantage(data, config=_algo_config(0.3), norm_adv_by_std_in_grpo=norm)
    s = setpo.diversity_marginals(emb, uids)
    torch.testing.assert_close(out.batch["advantages"], grpo.batch["advantages"] + 0.3 * s[:, None] * mask,
                               atol=1e-6, rtol=1e-5)


def _session_batch(seed=0, n_uids=3, sessions=4, length=6, dim=8):
    """verl v1 agent-loop rows: each session returns 1-3 outputs, keyed {uid}_{session_id}_{index}, shuffled."""
    rng = np.random.default_rng(seed)
    keys = [f"u{u}_{s}_{i}" for u in range(n_uids) for s in range(sessions) for i in range(int(rng.integers(1, 4)))]
    keys = [keys[j] for j in rng.permutation(len(keys))]
    n = len(keys)
    uids = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    lengths = rng.integers(1, length + 1, size=n)
    mask = (torch.arange(length)[None, :] < torch.as_tensor(lengths)[:, None]).float()
    token_rewards = torch.zeros(n, length)
    token_rewards[torch.arange(n), torch.as_tensor(lengths) - 1] = torch.as_tensor(rng.random(n), dtype=torch.float32)
    emb = torch.as_tensor(rng.normal(size=(n, dim)), dtype=torch.float32)
    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards, "response_mask": mask},
                               non_tensors={"uid": uids, sv.EMBEDDINGS_KEY: emb.numpy()})
    return data, keys, emb, uids, mask


def _verl_multi_trajectory_advantage(monkeypatch):
    """verl v1's compute_advantage_for_multi_trajectories, loaded from its file: the v1 package imports
    transfer_queue, which the CPU test environment lacks, so a stub stands in while its replay-buffer module
    (which only needs a constant from it here) is imported."""
    import importlib.util
    import pathlib

    import verl

    stub = types.ModuleType("transfer_queue")
    stub.KVBatchMeta = object
    monkeypatch.setitem(sys.modules, "transfer_queue", sys.modules.get("transfer_queue") or stub)
    root = pathlib.Path(verl.__file__).parent / "trainer" / "ppo" / "v1"
    modules = {}
    for name, file in (("verl.trainer.ppo.v1.replay_buffer", "replay_buffer.py"), ("_verl_v1_utils", "utils.py")):
        spec = importlib.util.spec_from_file_location(name, root / file)
        modules[name] = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, modules[name])
        spec.loader.exec_module(modules[name])
    return modules["_verl_v1_utils"].compute_advantage_for_multi_trajectories


@pytest.mark.parametrize("norm", [True, False])
def test_multi_output_sessions_match_verls_grpo_at_lambda_zero(norm, monkeypatch):
    multi = _verl_multi_trajectory_advantage(monkeypatch)

    data, keys, emb, uids, _ = _session_batch()
    ref = multi(_session_batch()[0], batch_keys=keys, adv_estimator="grpo", norm_adv_by_std_in_grpo=norm)
    cfg = OmegaConf.create({"adv_estimator": "setpo", "norm_adv_by_std_in_grpo": norm, "setpo": {"lam": 0.0}})
    with sv.batch_embeddings(emb, uids=uids, session_keys=keys):
        out = multi(data, batch_keys=keys, adv_estimator="setpo", norm_adv_by_std_in_grpo=norm, config=cfg)
    torch.testing.assert_close(out.batch["advantages"], ref.batch["advantages"], atol=1e-6, rtol=1e-5)
    # without the keys every row would count: a different (wrong) answer, which is why the hook passes them
    plain = sv.compute_advantage(_session_batch()[0], config=cfg)
    assert not torch.allclose(plain.batch["advantages"], ref.batch["advantages"], atol=1e-3)


def test_multi_output_sessions_count_once_in_the_set():
    data, keys, emb, uids, mask = _session_batch(seed=1)
    final_rows, back = session_layout(keys)
    rewards = data.batch["token_level_rewards"].sum(-1)
    expected = setpo.setpo_advantages(rewards[final_rows], emb[final_rows], uids[final_rows], lam=0.4)[back]
    out = sv.compute_advantage(data, config=_algo_config(0.4), batch_keys=keys)
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask, atol=1e-6, rtol=1e-5)


def test_session_texts_join_a_sessions_outputs_in_index_order():
    keys = ["a_0_1", "a_1_0", "a_0_0", "b_0_0"]
    assert session_texts(keys, ["second", "solo", "first", "b"]) == ["first\nsecond", "solo", "first\nsecond", "b"]
    with pytest.raises(ValueError, match="session key"):
        session_layout(["no-index"])


# ------------------------------------------------------------------ what the kernel reads, the gate, the monitor


def first_word(text):
    """An answer reader for the tests: the first word, None for a blank text or one starting with 'response 0'."""
    words = text.split()
    return None if not words or text.startswith("response 0") else " ".join(words[:2])


@pytest.mark.parametrize("gate", [None, 1.0])
def test_the_kernel_reads_the_answer_and_the_gate_on_verl(gate):
    data, rewards, _, uids, mask = _ragged_batch(seed=4)
    texts = [f"response {i % 4} {'x' * (i % 3)}" for i in range(len(uids))]
    del data.non_tensor_batch[sv.EMBEDDINGS_KEY]
    data.non_tensor_batch[sv.TEXTS_KEY] = np.array(texts, dtype=object)
    cfg = _algo_config(0.4, embedding_model="key", embedding_device="cpu", kernel_reads="answer",
                       answer_reader="test_verl:first_word", gate_reward=gate)
    out = sv.compute_advantage(data, config=cfg)
    rows = torch.tensor([first_word(t) is not None for t in texts])
    if gate is not None:
        rows &= rewards >= gate
    assert 0 < int(rows.sum()) < len(texts)
    expected = setpo.setpo_advantages(rewards, TextKeyEmbedder()([first_word(t) or "" for t in texts]), uids,
                                      lam=0.4, term_rows=rows)
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)
    # rows outside the sets get Ā alone
    grpo = setpo.setpo_advantages(rewards, None, uids, lam=0.0)
    torch.testing.assert_close(out.batch["advantages"][~rows].sum(-1), (grpo[:, None] * mask)[~rows].sum(-1))


def test_verl_settings_for_the_reader_are_checked():
    with pytest.raises(ValueError, match="kernel_reads='answer' needs an answer reader"):
        sv.SetPOVerlSettings(lam=0.1, kernel_reads="answer")
    with pytest.raises(ValueError, match="algorithm.setpo.answer_reader: .*cannot import"):
        sv.SetPOVerlSettings(lam=0.1, answer_reader="no_such_module_y:f")
    with pytest.raises(ValueError, match="gate_reward"):
        sv.SetPOVerlSettings(lam=0.1, gate_reward="high")


def test_trainer_hook_reads_answers_and_logs_the_monitor(monkeypatch):
    rng = np.random.default_rng(6)
    sizes, length = (4, 4, 4), 6
    uids = np.repeat([f"u{i}" for i in range(len(sizes))], sizes)
    store, keys = {}, []
    for i, u in enumerate(uids):
        n_tok = int(rng.integers(2, length + 1))
        tr = torch.zeros(length)
        tr[n_tok - 1] = 1.0
        key = f"{u}_{i}_0"
        keys.append(key)
        store[key] = {"uid": str(u), "responses": [int(t) for t in rng.integers(1, 4, size=n_tok)],
                      "token_level_rewards": tr, "response_mask": (torch.arange(length) < n_tok).float()}
    monkeypatch.setitem(sys.modules, "transfer_queue", _fake_transfer_queue(store))
    config = OmegaConf.create({"algorithm": {"adv_estimator": "setpo", "setpo": {
        "lam": 0.3, "embedding_model": "key", "embedding_device": "cpu", "kernel_reads": "answer",
        "answer_reader": "test_verl:first_word"}}})
    trainer = sv.setpo_trainer_class(_FakeVerlTrainer)(store, config)
    metrics = {}
    trainer._compute_advantage(types.SimpleNamespace(keys=keys, partition_id="train"), metrics)
    texts = _FakeTokenizer().batch_decode(_FakeNested([store[k]["responses"] for k in keys]).to_padded_tensor(0))
    answers = [first_word(t) for t in texts]
    rewards = torch.stack([store[k]["token_level_rewards"].sum() for k in keys])
    mask = torch.stack([store[k]["response_mask"] for k in keys])
    expected = setpo.setpo_advantages(rewards, TextKeyEmbedder()([a or "" for a in answers]), uids, lam=0.3)
    torch.testing.assert_close(trainer.result.batch["advantages"], expected[:, None] * mask)
    assert {"setpo/s_length_corr", "setpo/unread_fraction", "setpo/s_unread_gap"} <= set(metrics)
    unread = [bool(unread_text(t, a)) for t, a in zip(texts, answers, strict=True)]
    assert 0 < sum(unread) < len(unread)
    assert metrics["setpo/unread_fraction"] == pytest.approx(np.mean(unread))


# ------------------------------------------------------------------ the gate as documented, on both engines


def test_trl_and_verl_give_the_same_advantages_for_the_same_completions_and_rewards(tmp_path):
    """The same completions and rewards through TRL's trainer and verl's estimator, with the answer-key kernel,
    an answer reader and the gate: the same rows in Ω⁺, the same λ·s, and Â equal up to the two engines' ε in the
    group normalisation (TRL's 1e-4, verl's 1e-6)."""
    import copy

    from datasets import Dataset

    from helpers import completion_texts, score_batch
    from setpo.trl import SetPOConfig, SetPOTrainer
    from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer

    prompts, g, lam, tau = ["3 7 = 10\n", "2 5 9 = 19\n", "4 4 1 = 17\n"], 6, 0.4, 1.0
    tok = build_tokenizer()
    model = build_model(tok, ModelSize(32, 1, 2, 1, 64, 48), seed=0)

    def reward(completions, **_):
        return [float(len(c) % 3) for c in completions]

    args = SetPOConfig(output_dir=str(tmp_path), num_generations=g, per_device_train_batch_size=len(prompts) * g,
                       max_completion_length=6, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                       beta=0.0, seed=0, disable_tqdm=True, setpo_lambda=lam, embedder="key",
                       setpo_kernel_reads="answer", setpo_answer_reader="test_verl:first_char", setpo_gate_reward=tau)
    trainer = SetPOTrainer(model=copy.deepcopy(model), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    out = score_batch(trainer, prompts, g)
    texts = completion_texts(trainer, out)
    batch = trainer.last_setpo_batch
    rewards = batch["rewards"].float()
    in_sets = batch["in_sets"]
    assert 0 < int(in_sets.sum()) < len(texts) and bool(((rewards >= tau) | ~in_sets).all())
    uids = np.array([f"p{i // g}" for i in range(len(texts))], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards[:, None],
                                        "response_mask": torch.ones(len(texts), 1)},
                               non_tensors={"uid": uids, sv.TEXTS_KEY: np.array(texts, dtype=object)})
    cfg = _algo_config(lam, embedding_model="key", embedding_device="cpu", kernel_reads="answer",
                       answer_reader="test_verl:first_char", gate_reward=tau)
    verl_adv = sv.compute_advantage(copy.deepcopy(data), config=cfg).batch["advantages"][:, 0]
    verl_base = sv.compute_advantage(copy.deepcopy(data), config=_algo_config(0.0)).batch["advantages"][:, 0]
    torch.testing.assert_close(verl_adv - verl_base, lam * batch["s"].float(), rtol=0, atol=1e-5)  # same λ·s
    torch.testing.assert_close(verl_adv, out["advantages"], rtol=1e-3, atol=1e-3)  # same Â, up to the ε
    assert (lam * batch["s"]).abs().max() > 0.05  # the term is there to compare


def first_char(text):
    """The answer reader of the TRL ↔ verl comparison: the first non-blank character (None: blank)."""
    text = text.strip()
    return text[:1] or None


def test_verl_gate_refuses_kl_in_the_reward_and_takes_numpy_numbers():
    with pytest.raises(ValueError, match="use_kl_in_reward=true: the estimator sees token_level_rewards"):
        sv.SetPOVerlSettings.from_algorithm_config(OmegaConf.create(
            {"adv_estimator": "setpo", "use_kl_in_reward": True, "setpo": {"lam": 0.1, "gate_reward": 1.0}}))
    # without the gate the KL in the reward is verl's business, as before
    sv.SetPOVerlSettings.from_algorithm_config(OmegaConf.create(
        {"adv_estimator": "setpo", "use_kl_in_reward": True, "setpo": {"lam": 0.1}}))
    settings = sv.SetPOVerlSettings(lam=np.float32(0.1), gate_reward=np.float64(1.0), monitor_window=np.int64(4))
    assert (settings.lam, settings.gate_reward, settings.monitor_window) == (pytest.approx(0.1), 1.0, 4)
    assert type(settings.gate_reward) is float
    for kwargs, match in [({"gate_reward": True}, "gate_reward"), ({"monitor_window": 0}, "monitor_window"),
                          ({"monitor": "off"}, "monitor must be true or false"),
                          ({"embedding_model": "hash:x"}, "positive integer"),
                          ({"embedding_model": ""}, "embedding_model"),
                          ({"answer_reader": ".reader:f"}, "absolute module")]:
        with pytest.raises(ValueError, match=match):
            sv.SetPOVerlSettings(lam=0.1, **kwargs)


def test_precomputed_embeddings_are_refused_when_the_kernel_reads_the_answer():
    data, *_ = _ragged_batch()
    cfg = _algo_config(0.2, kernel_reads="answer", answer_reader="test_verl:first_char")
    with pytest.raises(ValueError, match="precomputed embeddings cannot go through the answer reader"):
        sv.compute_advantage(data, config=cfg)


def test_groups_without_marginal_counts_the_groups_the_gate_empties():
    rewards = torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1])
    ids = np.repeat(["a", "b", "c", "d"], 3)
    emb = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    gate = rewards >= 1.0
    _, s, without = verl_setpo_advantages(rewards, emb, ids, lam=0.3, term_rows=gate)
    assert without == 2  # b (no right answer) and c (two): fewer than 3 rows in Ω⁺
    assert s[3:9].abs().max() == 0 and s[:3].abs().max() > 0
    with pytest.raises(ValueError, match="term_rows must be booleans"):
        verl_setpo_advantages(rewards, emb, ids, lam=0.3, term_rows=rewards)


def test_the_monitor_can_be_turned_off_on_verl(monkeypatch):
    rng = np.random.default_rng(6)
    uids = np.repeat([f"u{i}" for i in range(3)], 4)
    store, keys = {}, []
    for i, u in enumerate(uids):
        n_tok = int(rng.integers(2, 7))
        tr = torch.zeros(6)
        tr[n_tok - 1] = 1.0
        keys.append(f"{u}_{i}_0")
        store[keys[-1]] = {"uid": str(u), "responses": [int(t) for t in rng.integers(1, 4, size=n_tok)],
                           "token_level_rewards": tr, "response_mask": (torch.arange(6) < n_tok).float()}
    monkeypatch.setitem(sys.modules, "transfer_queue", _fake_transfer_queue(store))
    for monitor in (True, False):
        config = OmegaConf.create({"algorithm": {"adv_estimator": "setpo", "setpo": {
            "lam": 0.3, "embedding_model": "hash", "embedding_device": "cpu", "monitor": monitor,
            "monitor_window": 2}}})
        trainer = sv.setpo_trainer_class(_FakeVerlTrainer)(store, config)
        metrics = {}
        trainer._compute_advantage(types.SimpleNamespace(keys=keys, partition_id="train"), metrics)
        assert ("setpo/s_length_corr" in metrics) is monitor and hasattr(trainer, "_setpo_monitor") is monitor
        if monitor:
            assert trainer._setpo_monitor.window == 2 and len(trainer._setpo_monitor._block) == 1


def test_the_smallest_real_run_is_scored_by_its_datas_verifier():
    """``smoke_train_command`` names the task whose verifier scores the data: the math verifier read a Countdown
    demo's ground truth ({"numbers", "target"}) as a gold answer, so every reward was 0 (refused by name since 0.4.0)."""
    from setpo.verl.cpu_demo import smoke_train_command

    math = smoke_train_command("m", "t", "v", "o")
    countdown = smoke_train_command("m", "t", "v", "o", task="countdown")
    assert math[math.index("--task") + 1] == "math" and countdown[countdown.index("--task") + 1] == "countdown"
