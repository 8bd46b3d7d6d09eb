"""setpo.verl.cpu piece by piece, without Ray: verl's FSDP2 actor model built by verl's own engine on
the CPU platform over gloo, the transformers rollout server (its log-probabilities are the model's, its weights
are the ones synced to it), the launcher's CPU configuration accepted by verl, and the version guard."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

from setpo.verl import launch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from setpo.verl.cpu_demo import write_countdown_demo

    return write_countdown_demo(tmp_path_factory.mktemp("cpu_demo"))


def _config(demo, **kw):
    cfg = launch.VerlLaunchConfig(model_path=demo["model"], tokenizer_path=demo["tokenizer"],
                                  train_files=[demo["train"]], val_files=[demo["val"]], device="cpu",
                                  task="countdown", n_gpus_per_node=2, rollout_n=4, train_batch_size=4,
                                  max_prompt_length=48, max_response_length=24, micro_batch_per_gpu=4,
                                  embedding_model="hash", output_dir="/tmp/unused", **kw)
    return launch.compose_config(launch.build_overrides(cfg))


def test_cpu_config_is_accepted_by_verl_and_says_what_the_cpu_needs(demo):
    config = _config(demo)
    launch.validate(config)
    ar = config.actor_rollout_ref
    assert config.trainer.device == "cpu" and ar.rollout.name == launch.CPU_ROLLOUT == "hf"
    assert ar.actor.strategy == ar.ref.strategy == "fsdp2" and not ar.model.use_remove_padding
    assert ar.model.override_config.attn_implementation == "sdpa" and not ar.actor.use_torch_compile
    assert config.ray_kwargs.ray_init.num_gpus == 2  # logical GPUs: one per FSDP worker
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu" and env.VERL_USE_EXTERNAL_MODULES == "setpo.verl,setpo.verl.cpu"
    assert config.reward.custom_reward_function.path == "pkg://setpo.envs.countdown"
    assert ar.actor.use_kl_loss and ar.actor.kl_loss_coef == pytest.approx(1e-4)  # ref policy + KL kept
    gpu = launch.compose_config(launch.build_overrides(launch.VerlLaunchConfig(
        model_path="/m", train_files=["/t.parquet"], val_files=["/v.parquet"])))
    assert gpu.trainer.device == "cuda" and "VERL_PLATFORM" not in gpu.ray_kwargs.ray_init.runtime_env.env_vars


def test_the_paper_settings_come_from_presets():
    from setpo.presets import PAPER_RUN

    d = launch.VerlLaunchConfig(model_path="/m", train_files=["/t"], val_files=["/v"])
    assert (d.rollout_n, d.temperature, d.max_response_length, d.kl_coef, d.train_batch_size, d.total_epochs,
            d.val_n, d.val_temperature, d.val_top_p) == (
        PAPER_RUN.num_generations, PAPER_RUN.temperature, PAPER_RUN.max_completion_length, PAPER_RUN.beta,
        PAPER_RUN.prompts_per_step, PAPER_RUN.num_train_epochs, PAPER_RUN.eval_k, PAPER_RUN.eval_temperature,
        PAPER_RUN.eval_top_p) == (6, 0.9, 756, 1e-4, 64, 2, 64, 0.5, 0.9)
    with pytest.raises(ValueError, match="device"):
        launch.VerlLaunchConfig(model_path="/m", train_files=["/t"], val_files=["/v"], device="tpu")


def test_other_verl_versions_are_refused_in_one_line():
    from setpo.verl.cpu import TESTED_VERL, check_verl_version

    check_verl_version(TESTED_VERL)
    with pytest.raises(RuntimeError, match=r"verl 0\.9\.1 only; found verl 0\.9\.2") as err:
        check_verl_version("0.9.2")
    assert "\n" not in str(err.value)


def test_install_registers_the_platform_the_engine_and_the_rollout():
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from setpo.verl import cpu

    cpu.install()
    cpu.install()  # idempotent
    platform = PlatformRegistry.get("cpu")()
    assert platform.communication_backend_name() == "gloo" and platform.ray_resource_name() == "GPU"
    assert not platform.is_platform_available()  # never auto-selected: a CPU run asks with VERL_PLATFORM=cpu
    x = torch.ones(2)
    assert x.to(platform.current_device()).device.type == "cpu"
    assert EngineRegistry._engines["language_model"]["fsdp2"]["cpu"] is FSDPEngineWithLMHead
    assert get_rollout_class("hf", "async") is cpu.HFServerAdapter
    assert RolloutReplicaRegistry.get("hf").__name__ == "HFRolloutReplica"


FSDP_BUILD = textwrap.dedent("""
    import os, socket, sys, json
    os.environ.update(VERL_PLATFORM="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    s = socket.socket(); s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1]); s.close()
    import torch
    import setpo.verl.cpu as cpu
    cpu.install()
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig
    from verl.workers.engine.base import EngineRegistry
    import verl.workers.engine_workers as ew
    from setpo.verl import launch
    demo = json.loads(sys.argv[1])
    cfg = launch.VerlLaunchConfig(model_path=demo["model"], tokenizer_path=demo["tokenizer"],
        train_files=[demo["train"]], val_files=[demo["val"]], device="cpu", task="countdown", n_gpus_per_node=1,
        rollout_n=4, train_batch_size=4, max_prompt_length=48, max_response_length=24, micro_batch_per_gpu=4)
    config = launch.compose_config(launch.build_overrides(cfg))
    ew.initialize_global_process_group_ray(timeout_second=60)  # verl's call, as its workers make it
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    engine = EngineRegistry.new("language_model", backend=actor.engine.strategy, model_config=model,
                                engine_config=actor.engine, optimizer_config=actor.optim,
                                checkpoint_config=actor.checkpoint)
    engine.initialize()
    from torch.distributed.tensor import DTensor
    params = list(engine.module.parameters())
    print("RESULT", json.dumps({"backend": torch.distributed.get_backend(), "strategy": actor.engine.strategy,
          "engine": type(engine).__name__, "dtensor": all(isinstance(p, DTensor) for p in params),
          "dtype": str(params[0].dtype), "n": sum(p.numel() for p in params)}))
    torch.distributed.destroy_process_group()
""")


@pytest.mark.slow
def test_verls_fsdp2_actor_model_builds_on_the_cpu(demo, tmp_path):
    import json

    r = subprocess.run([sys.executable, "-c", FSDP_BUILD, json.dumps(demo)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                                    "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.split("RESULT", 1)[1])
    assert got["backend"] == "gloo" and got["strategy"] == "fsdp2" and got["engine"] == "FSDPEngineWithLMHead"
    assert got["dtensor"] and got["dtype"] == "torch.float32" and got["n"] > 0


@pytest.fixture(scope="module")
def server(demo):
    from setpo.verl.cpu import HFGenerationServer

    config = _config(demo)
    return HFGenerationServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, replica_rank=0)


def _forward_logprobs(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_rollout_log_probs_are_the_models_own(server):
    import asyncio

    prompt = server.tokenizer.apply_chat_template([{"role": "user", "content": "3 4 5 = 17"}],
                                                  add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    out = asyncio.run(server.generate(prompt, {"temperature": 0.7, "top_p": 1.0, "top_k": -1}, request_id="r"))
    assert 1 <= len(out.token_ids) <= 24 and len(out.log_probs) == len(out.token_ids)
    # processed_logprobs (verl's default): the tempered distribution the tokens were drawn from
    torch.testing.assert_close(torch.tensor(out.log_probs), _forward_logprobs(server.model, prompt, out.token_ids,
                                                                              0.7), rtol=1e-4, atol=1e-4)
    greedy = [asyncio.run(server.generate(prompt, {"temperature": 0}, request_id="g")).token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_synced_weights_are_the_ones_generating(server, demo):
    import asyncio

    from transformers import AutoModelForCausalLM

    prompt = server.tokenizer.encode("<|im_start|>user\n9 2 7 = 25<|im_end|>\n<|im_start|>assistant\n")
    before = asyncio.run(server.generate(prompt, {"temperature": 0}, request_id="a")).token_ids
    other = AutoModelForCausalLM.from_pretrained(demo["model"], dtype=torch.float32)
    torch.manual_seed(1)
    state = {k: torch.randn_like(v) * 0.5 for k, v in other.state_dict().items()}
    other.load_state_dict(state)
    version = server.weight_version
    assert server.update_weights(dict(state), global_steps=7) == version + 1
    after = asyncio.run(server.generate(prompt, {"temperature": 0}, request_id="b"))
    assert after.extra_fields["global_steps"] == 7
    with torch.no_grad():
        expect = other.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=len(after.token_ids),
                                eos_token_id=server.eos_token_id, pad_token_id=server.pad_token_id)[0, len(prompt):]
    assert after.token_ids == expect.tolist()[: len(after.token_ids)] and after.token_ids != before
    with pytest.raises(ValueError, match="does not have"):
        server.update_weights({"not.a.parameter": torch.zeros(1)})


def test_run_in_session_reports_and_kills_what_a_run_leaves_behind():
    import os
    import time

    from setpo.verl.cpu_demo import run_in_session

    status, out, left, _ = run_in_session(["sh", "-c", "sleep 60 & echo started"], timeout=30, grace_s=1)
    assert status == 0 and out.strip() == "started" and len(left) == 1  # the orphaned sleep, then killed
    time.sleep(0.5)
    for pid in left:  # killed: gone, or a zombie waiting for init to reap it
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if os.path.exists(
            f"/proc/{pid}/stat") else "gone"
        assert state in ("gone", "Z"), (pid, state)
    status, _, left, _ = run_in_session(["sleep", "60"], timeout=1, grace_s=1)
    assert status is None and left == []  # a timeout kills the whole session


def test_run_in_session_measures_the_sessions_peak_memory():
    """The peak is of the whole session: a child that holds 200 MiB for two seconds is seen, and counted once."""
    import sys

    from setpo.verl.cpu_demo import run_in_session

    hold = "import time; b = b'x' * (200 << 20); time.sleep(2)"
    run = run_in_session(["sh", "-c", f"{sys.executable} -c \"{hold}\"; true"], timeout=60, grace_s=1)
    assert run.status == 0 and run.left == []
    assert 200 << 20 <= run.peak_bytes < 320 << 20, run.peak_bytes
