"""The multi-node recipe on one machine (benchmarks/verl_ray_nodes.py): two Ray nodes started with `ray start`,
verl's CPU run (SetPO+GRPO on the tiny Countdown Qwen2, 2 steps) sent with `ray job submit`, its FSDP workers
on both nodes by Ray's own state API, and every process of both nodes gone at the end, pass or fail.

About 3-4 min on 2 cores (two raylets, then the job importing verl in each of its Ray processes).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("ray")

from setpo.verl.cpu_demo import run_in_session, session_pids  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "verl_ray_nodes.py"


def _sweep(sessions: list[int]) -> list[int]:
    """Kill whatever is left of these sessions; return what was left."""
    left = [pid for sid in sessions for pid in session_pids(sid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray_nodes")
    pid_file = tmp / "ray_start_sessions.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp), "--pid-file", str(pid_file)]
    sessions: list[int] = []
    try:
        status, output, left, _ = run_in_session(cmd, 560, cwd=ROOT, env=env)
        sessions = json.loads(pid_file.read_text()) if pid_file.is_file() else []
        leftover = [pid for sid in sessions for pid in session_pids(sid)]
    finally:  # the nodes' own sessions: whatever the script could not stop (it was killed, or it failed)
        swept = _sweep(json.loads(pid_file.read_text()) if pid_file.is_file() else sessions)
    assert status is not None, f"the rehearsal did not finish in time:\n{output[-4000:]}"
    assert status == 0, output[-6000:]
    return {"record": json.loads((tmp / "verl_ray_nodes.json").read_text()),
            "md": (tmp / "verl_ray_nodes.md").read_text(), "left": left, "leftover": leftover, "swept": swept, "sessions": sessions}


@pytest.mark.slow
def test_job_succeeds_on_two_nodes_and_trains(rehearsal):
    r = rehearsal["record"]
    assert r["job_status"] == "SUCCEEDED"
    assert r["metric_steps"] == [1, 2] and r["setpo_metrics_every_step"] and r["checkpoint"] == "2"
    assert "ray job submit" in r["ray_job_submit"] and all("ray start" in c for c in r["ray_start"])
    print(f"ray nodes: up {r['start_s']:.0f} s, job {r['job_s']:.0f} s, stop {r['stop_s']:.0f} s, "
          f"total {r['total_s']:.0f} s")


@pytest.mark.slow
def test_workers_are_placed_on_both_nodes_by_rays_state(rehearsal):
    r = rehearsal["record"]
    nodes = r["placement"]["nodes"]
    alive = sorted(n["node_id"] for n in nodes if n["state"] == "ALIVE")
    assert len(alive) == 2 and sum(n["head"] for n in nodes) == 1
    assert all(n["GPU"] == 1 for n in nodes)  # one logical GPU per node: one FSDP worker each
    assert r["worker_node_ids"] == alive and r["two_nodes_used"]
    workers = [a for a in r["placement"]["actors"] if "WorkerDict" in a["class"]]
    assert len(workers) == 2 and {a["node_id"] for a in workers} == set(alive)
    assert sorted(r["server_node_ids"]) == alive  # each node's worker has its rollout server beside it
    assert "| head |" in rehearsal["md"] and "| node 1 |" in rehearsal["md"]


@pytest.mark.slow
def test_no_ray_process_is_left(rehearsal):
    assert len(rehearsal["sessions"]) == 2
    assert rehearsal["record"]["left_after_stop"] == []
    assert rehearsal["left"] == [] and rehearsal["leftover"] == [] and rehearsal["swept"] == []
    assert not [pid for sid in rehearsal["sessions"] for pid in session_pids(sid)]


# ---------------------------------------------------------------- the launcher's side (fast: no Ray started)


def _cfg(**kw):
    from setpo.verl.launch import VerlLaunchConfig

    return VerlLaunchConfig(model_path="m", train_files=["t"], val_files=["v"], device="cpu", n_gpus_per_node=1, **kw)


def test_joining_a_cluster_passes_no_ray_init_resources():
    from setpo.verl.launch import build_overrides

    local = build_overrides(_cfg())
    joined = build_overrides(_cfg(nnodes=2, ray_address="127.0.0.1:6379"))
    resources = ("ray_kwargs.ray_init.num_gpus=", "ray_kwargs.ray_init.num_cpus=", "ray_init.include_dashboard=")
    assert all(any(r in o for o in local) for r in resources)
    assert not any(r in o for o in joined for r in resources)  # ray.init(address=...) refuses them
    assert "+ray_kwargs.ray_init.address='127.0.0.1:6379'" in joined and "trainer.nnodes=2" in joined
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu" in joined


def test_cpu_run_on_several_nodes_needs_a_cluster():
    with pytest.raises(ValueError, match="ray start"):
        _cfg(nnodes=2)


def test_ray_address_comes_from_the_flag_or_rays_environment(monkeypatch):
    from setpo.verl.launch import build_parser, launch_config_from_args

    args = ["train", "--model-path", "m", "--train-file", "t.parquet", "--val-file", "v.parquet", "--device", "cpu"]
    monkeypatch.setattr("setpo.verl.launch.prepare_data", lambda path, *a: path)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what `ray job submit` sets for its entrypoint
    assert launch_config_from_args(build_parser().parse_args(args)).ray_address == "10.0.0.1:6379"
    flag = build_parser().parse_args([*args, "--ray-address", "10.0.0.2:6379"])
    assert launch_config_from_args(flag).ray_address == "10.0.0.2:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    assert launch_config_from_args(build_parser().parse_args(args)).ray_address is None


def test_vllm_gets_the_tokenizer_folder():
    from setpo.verl.launch import VerlLaunchConfig, build_overrides

    cfg = VerlLaunchConfig(model_path="m", train_files=["t"], val_files=["v"], tokenizer_path="/tok")
    assert "+actor_rollout_ref.rollout.engine_kwargs.vllm.tokenizer=/tok" in build_overrides(cfg)
    assert not any("engine_kwargs" in o for o in build_overrides(_cfg(tokenizer_path="/tok")))
