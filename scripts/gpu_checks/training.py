"""Training on the device: notebook 06's TRL path (``check_training``) and verl's own trainer end to end
(``check_verl_e2e``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpu_checks import ROOT
from gpu_checks.numerics import minilm_path


def check_training(device: str, run_root: Path) -> dict:
    import torch

    from setpo.embed import load_embedder
    from setpo_lab.studies import math as ml
    from setpo_lab.studies import figures
    from setpo.trl import quiet_libraries

    quiet_libraries()
    spec = "default" if minilm_path() is not None else "hash"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = ml.MathRunConfig.cpu_demo(run_dir=str(run_root / "generate"), use_vllm=False, max_steps=3, save_steps=2,
                                    probe_every=2, max_completion_length=48 if device == "cuda" else 16,
                                    eval_k=4, eval_limit=8 if device == "cuda" else 4, embedder=spec,
                                    train_limit=32, val_limit=8)
    train, val = ml.load_study_problems(cfg)
    embedder = load_embedder(cfg.embedder, device=device)
    t0 = time.time()
    finals = ml.train_runs(cfg, train, val[:cfg.n_probe], embedder=embedder, log=lambda *a: None)
    out: dict = {"embedder": spec, "train_s": round(time.time() - t0, 1)}
    for label, final in finals.items():
        done = json.loads((final / "done.json").read_text())
        assert done["steps"] == 3, f"{label} ran {done['steps']} steps"
        history = json.loads((final.parent / "log_history.json").read_text())
        assert any("setpo/s_mean" in h for h in history), f"{label}: no SetPO metrics logged"
        res = ml.evaluate_avg_at_k(cfg, final, val)
        out[label] = {"steps": done["steps"], "avg_at_k": res["avg_at_k"], "eval_s": round(res["seconds"], 1)}
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
        assert peak > 0, "nothing was allocated on the GPU: training did not run there"
        out["peak_gpu_mib"] = round(peak / 2**20)
    probes = {label: figures.read_probes(f.parent / "probes.jsonl") for label, f in finals.items()}
    try:
        import plotly  # noqa: F401

        _, data = figures.probe_trajectory_figure(probes, embedder, method="pca")
        assert data["steps"] == [0, 2, 3], data["steps"]
        out["trajectory_points"] = sum(len(v["xy"]) for v in data["points"].values())
    except ImportError:  # the bare machine has no plotly: check the projection the figure is drawn from
        from setpo_lab.studies.figures import project_texts

        xy = project_texts([r["text"] for recs in probes.values() for r in recs], embedder, method="pca")
        out["trajectory_points"] = len(xy)
        out["trajectory_figure"] = "skipped (plotly not installed); projection computed"
    out["vllm"] = "not checked here (not installed on the bare machine)"
    return out


#: what verl_e2e needs beyond the wheel folder: verl's full stack (the `verl-gpu` extra), by distribution name
#: (not import spec: check_verl may have stubbed ``ray`` in this process)
VERL_E2E_PACKAGES = ("ray", "vllm", "TransferQueue", "verl")
VERL_E2E_STEPS = 3
VERL_E2E_TIMEOUT_S = 540


def verl_e2e_command(demo: dict, out: Path, device: str) -> list[str]:
    """tests/test_verl_e2e.py's training command (the CPU demo's inputs, SetPO+GRPO at λ = 0.5, G = 4, 3 steps,
    a checkpoint at step 3, verl's file logger); on "cuda" only the platform and the rollout change: one GPU,
    vLLM (eager, a small share of the GPU: the policy has ~80K parameters), its tokenizer from the demo's folder."""
    from setpo.verl.cpu_demo import cpu_demo_command

    cmd = cpu_demo_command(demo, str(out))
    cmd[0] = sys.executable
    for flag, value in (("--device", device), ("--total-steps", VERL_E2E_STEPS), ("--test-freq", -1),
                        ("--save-freq", VERL_E2E_STEPS)):
        cmd[cmd.index(flag) + 1] = str(value)
    cmd += ["--lam", "0.5", "--experiment-name", "e2e", "--logger", "console,file"]
    if device == "cuda":
        cmd += ["--n-gpus-per-node", "1", "--gpu-memory-utilization", "0.3"]
    cmd += ["trainer.val_before_train=false"]  # verl overrides from here on
    if device == "cuda":
        cmd += ["actor_rollout_ref.rollout.enforce_eager=true"]
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:  # verl's default attention on CUDA is flash_attention_2
            cmd += ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                    "actor_rollout_ref.model.use_remove_padding=false"]
    return cmd


def check_verl_e2e(device: str, run_root: Path, requested: bool = False) -> dict:
    """verl's v1 trainer end to end (``python -m setpo.verl train``) on CUDA with vLLM rollouts; on the CPU, only
    when ``requested`` (``--only verl_e2e --allow-cpu``), the same run with ``--device cpu`` as a dry run."""
    from importlib import metadata

    if device != "cuda" and not requested:
        return {"skipped": "no CUDA device (on the CPU this run is tests/test_verl_e2e.py; `--only verl_e2e "
                           "--allow-cpu` runs it here through this check)"}
    missing = []
    for name in VERL_E2E_PACKAGES:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if device == "cpu":
        missing = [m for m in missing if m != "vllm"]  # the CPU twin rolls out with transformers
    if missing:
        return {"skipped": f"not installed: {', '.join(missing)} (verl's full stack: pip install -e '.[verl-gpu]')"}
    from setpo.verl.cpu_demo import run_in_session, write_countdown_demo
    from setpo.verl.launch import METRICS_FILE

    demo = write_countdown_demo(run_root / "verl_demo")
    out = run_root / "verl_runs"
    cmd = verl_e2e_command(demo, out, device)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "1", "PYTHONUNBUFFERED": "1",
           **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if device == "cpu" else {})}
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, stopped at the end
    t0 = time.time()
    status, output, left, _ = run_in_session(cmd, VERL_E2E_TIMEOUT_S, cwd=ROOT, env=env)
    wall = round(time.time() - t0, 1)
    assert status is not None, f"the verl run did not finish in {VERL_E2E_TIMEOUT_S} s:\n{output[-3000:]}"
    assert status == 0, f"the verl run exited with {status}:\n{output[-3000:]}"
    assert not left, f"processes of the run still alive after it ended: {left}"
    run_dir = out / "e2e"
    overrides = (run_dir / "overrides.txt").read_text().splitlines()
    rollout = next(o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.rollout.name="))
    assert rollout == ("vllm" if device == "cuda" else "hf"), f"rollout {rollout!r}"
    ckpt = run_dir / "checkpoints"
    assert (ckpt / f"global_step_{VERL_E2E_STEPS}" / "actor").is_dir(), f"no verl checkpoint in {ckpt}"
    latest = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    assert latest == str(VERL_E2E_STEPS), f"latest checkpoint {latest}"
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
    metrics = {r["step"]: r["data"] for r in rows}
    assert sorted(metrics) == list(range(1, VERL_E2E_STEPS + 1)), f"steps logged: {sorted(metrics)}"
    for step, data in metrics.items():
        missing_keys = {"setpo/s_mean", "setpo/s_std", "setpo/lambda_s_over_adv"} - set(data)
        assert not missing_keys, f"step {step}: no {sorted(missing_keys)} in verl's metrics"
        assert data["timing_s/step"] > 0 and "timing_s/gen" in data and "actor/pg_loss" in data, step
    res = {"device": device, "rollout": rollout, "wall_s": wall, "steps": sorted(metrics), "checkpoint": latest,
           "step_s": [round(metrics[k]["timing_s/step"], 2) for k in sorted(metrics)],
           "gen_s": [round(metrics[k]["timing_s/gen"], 2) for k in sorted(metrics)],
           "setpo_s_mean": [metrics[k]["setpo/s_mean"] for k in sorted(metrics)],
           "rollout_probs_diff_max": [metrics[k].get("training/rollout_probs_diff_max") for k in sorted(metrics)],
           "command": " ".join(cmd[1:])}
    if device == "cuda":
        peak = max(metrics[k].get("perf/max_memory_allocated_gb", 0.0) for k in metrics)
        assert peak > 0, "verl's actor reported no GPU memory: training did not run on the GPU"
        res["actor_peak_gpu_gb"] = peak
    return res
