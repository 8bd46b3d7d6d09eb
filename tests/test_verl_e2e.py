"""verl's own v1 trainer, end to end on the CPU: ``python -m setpo.verl train --device cpu`` trains the
tiny Countdown Qwen2 with SetPO+GRPO on 2 FSDP2 workers over gloo, with transformers rollouts from the current
policy, the real Countdown verifier, the reference model and KL, verl's logger and checkpoint manager.

Two runs of the same experiment (about 2 x 2 min on 2 cores, most of it Ray and its processes importing verl):
3 steps at λ = 0.5 that end in verl's checkpoint, then a rerun that resumes from it and trains step 4 at λ = 0.
The first runs through verl's own ``python -m verl.trainer.main_ppo`` with the overrides ``python -m setpo.verl
print-config`` prints and ``VERL_USE_EXTERNAL_MODULES`` (the README's "Add SetPO to your verl job"), the rerun
through the launcher (``python -m setpo.verl train``): both paths train SetPO, and one resumes the other.
Each step's advantages (the trainer's audit, ``SETPO_VERL_AUDIT``) are checked against verl's own ``"grpo"`` on
the same batch: bit for bit at λ = 0, plus λ·s with s recomputed here by ``setpo.diversity_marginals`` at λ > 0.
Every process a run starts (its own session) is gone when the test ends, pass or fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from setpo.verl.cpu_demo import run_in_session  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LAM = 0.5
G = 4


def _train(demo: dict, out: Path, audit: Path, lam: float, steps: int, timeout: float,
           main_ppo: bool = False) -> subprocess.CompletedProcess:
    """One run by the launcher, or (main_ppo) by verl's own entry point with the launcher's printed overrides."""
    cmd = [sys.executable, "-m", "setpo.verl", "train", "--device", "cpu", "--task", "countdown",
           "--model-path", demo["model"], "--tokenizer-path", demo["tokenizer"], "--train-file", demo["train"],
           "--val-file", demo["val"], "--embedding-model", "hash", "--lam", str(lam), "--rollout-n", str(G),
           "--train-batch-size", "4", "--max-prompt-length", "48", "--max-response-length", "24",
           "--micro-batch-per-gpu", "4", "--val-n", "2", "--test-freq", "-1", "--save-freq", "3",
           "--total-steps", str(steps), "--output-dir", str(out), "--experiment-name", "e2e",
           "--logger", "console,file", "trainer.val_before_train=false",
           f"+ray_kwargs.ray_init.runtime_env.env_vars.SETPO_VERL_AUDIT={audit}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_DEDUP_LOGS": "1", "PYTHONUNBUFFERED": "1"}
    if main_ppo:
        printed = subprocess.run([*cmd[:3], "print-config", *cmd[4:]], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=120)
        assert printed.returncode == 0, printed.stderr[-3000:]
        overrides = [line for line in printed.stdout.splitlines() if "=" in line and not line.startswith("[")]
        assert "algorithm.adv_estimator=setpo" in overrides
        # Hydra's own run folder (outputs/<date>/<time> of the working directory by default) goes beside the run
        cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, f"hydra.run.dir={out / 'hydra'}"]
        # the driver imports the plug-in (and the CPU platform) too; the overrides carry it to every worker
        env.update(VERL_USE_EXTERNAL_MODULES="setpo.verl,setpo.verl.cpu", VERL_PLATFORM="cpu")
    status, output, left, _ = run_in_session(cmd, timeout, cwd=ROOT, env=env)
    assert status is not None, f"the CPU run did not finish in {timeout:.0f} s:\n{output[-4000:]}"
    assert not left, f"processes of the run still alive after it ended: {left}"
    return subprocess.CompletedProcess(cmd, status, output, "")


def _metrics(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["data"] for r in rows}


def _audit(folder: Path) -> dict[int, dict]:
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in folder.glob("step_*.json")}


def _per_row(record: dict, name: str) -> torch.Tensor:
    """One value per response: the advantage is the same on every response token (outcome estimators)."""
    rows = record[name]
    for values in rows:
        assert values and all(v == values[0] for v in values), f"{name} differs within a response"
    return torch.tensor([v[0] for v in rows], dtype=torch.float32)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from setpo.verl.cpu_demo import write_countdown_demo

    tmp = tmp_path_factory.mktemp("verl_e2e")
    demo = write_countdown_demo(tmp / "demo")
    out = tmp / "runs"
    t0 = time.perf_counter()
    first = _train(demo, out, tmp / "audit1", lam=LAM, steps=3, timeout=280, main_ppo=True)
    t1 = time.perf_counter()
    assert first.returncode == 0, first.stdout[-6000:]
    metrics1 = _metrics(out / "e2e" / "metrics.jsonl")
    second = _train(demo, out, tmp / "audit2", lam=0.0, steps=4, timeout=250)
    t2 = time.perf_counter()
    assert second.returncode == 0, second.stdout[-6000:]
    return {"out": out / "e2e", "first": first, "second": second, "metrics1": metrics1,
            "metrics2": _metrics(out / "e2e" / "metrics.jsonl"), "audit1": _audit(tmp / "audit1"),
            "audit2": _audit(tmp / "audit2"), "seconds": (t1 - t0, t2 - t1)}


@pytest.mark.slow
def test_cpu_run_finishes_writes_verls_checkpoint_and_resumes(runs):
    ckpt = runs["out"] / "checkpoints"
    assert (ckpt / "global_step_3" / "actor").is_dir()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"  # the rerun saved step 4
    assert sorted(runs["metrics1"]) == [1, 2, 3]
    assert sorted(runs["metrics2"]) == [4]  # resumed at step 4: steps 1-3 were not trained again
    assert "global_step_3" in runs["second"].stdout  # verl's checkpoint manager loaded it
    assert "[setpo.verl]" in runs["second"].stdout  # the launcher's heartbeat
    assert "verl.trainer.main_ppo" in runs["first"].args  # the first run was verl's own entry point
    print(f"verl CPU runs: {runs['seconds'][0]:.0f} s (3 steps) + {runs['seconds'][1]:.0f} s (resume, 1 step)")


@pytest.mark.slow
def test_setpo_metrics_and_verls_timings_are_logged_every_step(runs):
    for step, data in {**runs["metrics1"], **runs["metrics2"]}.items():
        assert {"setpo/s_mean", "setpo/s_std", "setpo/lambda_s_over_adv"} <= set(data), step
        assert data["timing_s/step"] > 0 and "timing_s/gen" in data and "actor/pg_loss" in data
        assert data["actor/kl_coef"] == pytest.approx(1e-4)  # the reference policy and KL are on
        # rollouts come from the current policy: the rollout's log-probs are the actor's, recomputed
        assert data["training/rollout_probs_diff_max"] < 1e-4, step
    assert "setpo/embed_time_s" in runs["metrics1"][1] and "setpo/embed_time_s" not in runs["metrics2"][4]


@pytest.mark.slow
def test_lambda_zero_advantages_are_verls_grpo_bit_for_bit(runs):
    record = runs["audit2"][4]
    assert record["estimator"] == "setpo" and len(record["keys"]) == 4 * G
    assert record["advantages"] == record["grpo_advantages"]


@pytest.mark.slow
def test_lambda_positive_advantages_are_grpo_plus_lambda_s(runs):
    import setpo
    from setpo.embed import load_embedder

    embed = load_embedder("hash")
    assert sorted(runs["audit1"]) == [1, 2, 3]
    moved = 0.0
    for step, record in runs["audit1"].items():
        uids = record["uids"]
        assert len(uids) == 4 * G and all(uids.count(u) == G for u in uids), step
        s = setpo.diversity_marginals(embed(record["texts"]), uids)
        grpo, adv = _per_row(record, "grpo_advantages"), _per_row(record, "advantages")
        torch.testing.assert_close(adv, grpo + LAM * s.float(), rtol=1e-5, atol=1e-6)
        # the rewards are the Countdown verifier's: format reward 0.1 or 1.0, or 0
        assert set(record["scores"]) <= {0.0, 0.1, 1.0}
        moved = max(moved, float((adv - grpo).abs().max()))
    assert moved > 1e-3  # the diversity term is really there
