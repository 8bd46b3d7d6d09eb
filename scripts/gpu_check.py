"""GPU check: the estimator, verl's hook and TRL training on CUDA, and SetPO's cost at the paper's sizes.

For a bare CUDA machine: torch, transformers, sentence-transformers, accelerate, pandas and pyarrow installed,
no internet. Everything else the check needs (TRL, datasets, verl's core without Ray, gymnasium, math-verify,
...) is gathered beforehand into a wheel folder: about 7 MB (prepare refuses more than 60 MB).

  1. On a machine with internet, once (wheels for Python 3.11 and 3.12, the versions TRL and verl support):
         python scripts/gpu_check.py prepare --wheels runs/gpu_wheels
  2. Copy the repository (with runs/gpu_wheels) to the GPU machine and run, in under 8 minutes (plus a few
     for verl_e2e where verl's full stack is installed):
         python scripts/gpu_check.py all --wheels runs/gpu_wheels --out runs/gpu_check
     ("all" installs the folder with pip --no-index --no-deps, then runs the checks in a fresh process.)
  Dry run on a CPU, the same commands with tiny shapes (what tests/test_gpu_check.py runs):
         python scripts/gpu_check.py all --wheels runs/gpu_wheels --out runs/gpu_check --allow-cpu

What "run" (the checks alone, also the default when no command is given) does:
  estimator   setpo_advantages / diversity_marginals on CUDA equal the CPU: ragged shuffled groups in float32
              and float64, and bf16 embeddings with float32 advantages
  verl        verl's registered "setpo" estimator (core_algos registry) with CUDA tensors; Ray is replaced by
              an import-time stub when it is not installed (the estimator path never calls it)
  embedders   an embedder on CUDA agrees with the CPU (all-MiniLM-L6-v2 if its package is installed, else a
              random Qwen3-shaped encoder built from a config); verl's embedding_device "auto" picks the GPU
  training    notebook 04's path: GRPO and SetPO+GRPO steps with a small Qwen2 built from a config, avg@k,
              the embedding projection of the probes
  floor       the estimator's time against its floor (one torch.bmm forming the Gram matrices) at
              (B, G, d) = (512, 16, 1024) and (1024, 64, 4096), contiguous and shuffled groups
  overhead    SetPO's step time over GRPO's (TRL, interleaved) with random models shaped like the paper's:
              a Qwen2.5-Math-1.5B-shaped policy and a Qwen3-Embedding-0.6B-shaped embedder, 756-token responses
  verl_e2e    verl's own trainer end to end with vLLM rollouts: tests/test_verl_e2e.py's run (`python -m
              setpo.verl train`, the tiny Countdown Qwen2, SetPO+GRPO, 3 steps, verl's checkpoint and file
              logger) with only the platform (CUDA, 1 GPU) and the rollout (vLLM) changed; it finishes, writes
              verl's checkpoint and logs setpo/* metrics at every step. Needs verl's full stack (Ray, vLLM,
              TransferQueue: `pip install -e '.[verl-gpu]'`), which the wheel folder does not carry: skipped,
              with the reason, on a machine without it or without CUDA (a few minutes when it runs)
Writes gpu_check.json and gpu_check.md to --out (default $OUT or runs/gpu_check); exits 1 if a check fails
(a skipped check is not a failure; the report says why it was skipped).
--allow-cpu runs it all on the CPU as a dry run with tiny shapes (the CUDA comparisons then compare the CPU
with itself); verl_e2e is skipped there unless named with --only, which runs its CPU twin (--device cpu,
transformers rollouts: the CI test's run) through the same checks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

START = time.time()
BUDGET_S = 8 * 60
MAX_WHEELS_MB = 60

#: What the check needs beyond the bare machine's packages, pinned to the versions the project tests with.
#: Downloaded with --no-deps: exactly these files, nothing they would pull in (verl's Ray, vLLM, ...).
WHEELS = {
    "trl==1.16.0": "SetPOTrainer's base (GRPOTrainer)",
    "datasets==5.2.0": "TRL's datasets",
    "dill==0.4.1": "datasets",
    "multiprocess==0.70.19": "datasets",
    "xxhash==4.1.0": "datasets",
    "gymnasium==1.4.0": "envs (imported by the reward functions' package)",
    "cloudpickle==3.1.3": "gymnasium",
    "farama-notifications==0.0.6": "gymnasium",
    "math-verify==0.9.0": "the math reward",
    "latex2sympy2_extended==1.11.0": "math-verify",
    "omegaconf==2.3.1": "verl's config objects",
    "verl==0.9.1": "verl's core_algos registry (its Ray-based trainer is not run)",
    "codetiming==1.4.0": "verl",
    "tensordict==0.10.0": "verl",
    "pyvers==0.1.0": "tensordict",
    "orjson==3.13.0": "tensordict",
}
#: Only published as a source archive: built into a (pure-Python) wheel by ``prepare``.
SDIST_WHEELS = {"antlr4-python3-runtime==4.9.3": "omegaconf and math-verify's LaTeX parser"}
#: The bare machine's packages (``install`` checks they are there; it never installs them).
BASE_PACKAGES = ("torch", "transformers", "sentence_transformers", "accelerate", "pandas", "pyarrow")


#: every check, in the order "run" runs them
CHECKS = ("estimator", "verl", "embedders", "training", "floor", "overhead", "verl_e2e")


def elapsed() -> float:
    return time.time() - START


# ------------------------------------------------------------------------------------------------ prepare


#: The GPU machine's Python is not known in advance: compiled wheels are fetched for each of these.
PYTHON_VERSIONS = ("3.11", "3.12")  # TRL 1.16 needs >= 3.11, verl 0.9.1 < 3.13


def prepare(wheels: Path, python_versions=PYTHON_VERSIONS, platform_tag: str | None = None) -> int:
    """Download (pip download --no-deps) every wheel the check needs into ``wheels``, for each Python version
    (compiled wheels differ by version; pure ones are shared), build the sdist-only ones, check the size."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    for version in python_versions:
        target = ["--python-version", version, "--implementation", "cp",
                  *(["--platform", platform_tag] if platform_tag else [])]
        cmd = [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *target, *WHEELS]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            return 1
    cmd = [*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), *SDIST_WHEELS]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode:
        return 1
    files = sorted(wheels.glob("*.whl"))
    total = sum(f.stat().st_size for f in files)
    manifest = {"python_versions": list(python_versions), "files": {f.name: f.stat().st_size for f in files},
                "total_mb": round(total / 2**20, 2), "why": {**WHEELS, **SDIST_WHEELS}}
    (wheels / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(files)} wheels, {total / 2**20:.1f} MB in {wheels} (limit {MAX_WHEELS_MB} MB)")
    if total > MAX_WHEELS_MB * 2**20:
        print(f"the wheel folder is over {MAX_WHEELS_MB} MB", file=sys.stderr)
        return 1
    return 0


def install(wheels: Path) -> int:
    """pip install --no-index --no-deps the pinned packages from ``wheels`` (pip picks the wheel that fits
    this Python), after checking that the base packages are there."""
    import importlib.util

    missing = [p for p in BASE_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        print(f"missing base packages (install them first): {', '.join(missing)}", file=sys.stderr)
        return 2
    if not any(wheels.glob("*.whl")):
        print(f"no wheels in {wheels}; run `python scripts/gpu_check.py prepare --wheels {wheels}` on a machine "
              "with internet first", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index",
           "--find-links", str(wheels), "--no-deps", *WHEELS, *SDIST_WHEELS]
    print("+", " ".join(cmd[:9]), f"... ({len(WHEELS) + len(SDIST_WHEELS)} packages)", flush=True)
    return subprocess.run(cmd).returncode


# ------------------------------------------------------------------------------------------------ Ray stub


def stub_missing_ray() -> bool:
    """Make ``import ray`` (and its submodules) succeed with inert stand-ins when Ray is not installed.

    ``import verl`` imports Ray at module level (its single-controller and protocol modules), but the
    advantage-estimator registry this check exercises never calls it. Ray's wheel (~70 MB) would not fit
    the wheel folder, so its names are stubbed: attributes are placeholders, decorators return what they
    decorate. Anything that really uses Ray would fail loudly. Returns whether the stub was installed.
    """
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    if importlib.util.find_spec("ray") is not None:
        return False

    class Placeholder:
        def __init__(self, name):
            self._name = name

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{self._name}.{name}")

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and not kwargs and callable(args[0]):
                return args[0]  # used as a decorator (@ray.remote)
            return Placeholder(f"{self._name}()")

        def __getitem__(self, item):
            return self

        def __or__(self, other):
            return self

        __ror__ = __or__

        def __mro_entries__(self, bases):
            return (object,)

        def __repr__(self):
            return f"<ray stub {self._name}>"

    class StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{self.__name__}.{name}")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname == "ray" or fullname.startswith("ray."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = StubModule(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())
    return True


# ------------------------------------------------------------------------------------------------ checks


def ragged_batch(seed: int, dtype, dim: int = 1024, groups: int = 48):
    """~300 rows in 48 groups of 3..9 rollouts, shuffled; 0/1 rewards; random embeddings."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 10, size=groups)
    uids = np.repeat(np.array([f"q{i}" for i in range(len(sizes))], dtype=object), sizes)
    uids = uids[rng.permutation(len(uids))]
    rewards = torch.as_tensor(rng.integers(0, 2, size=len(uids)), dtype=torch.float32 if dtype == torch.bfloat16
                              else dtype)
    emb = torch.as_tensor(rng.normal(size=(len(uids), dim)), dtype=torch.float32).to(dtype)
    return uids, rewards, emb


def check_estimator(device: str) -> dict:
    import torch

    import setpo

    out = {}
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 1e-5)):
        uids, r, e = ragged_batch(0, dtype)
        cpu_s = setpo.diversity_marginals(e, uids)
        dev_s = setpo.diversity_marginals(e.to(device), uids)
        cpu_a = setpo.setpo_advantages(r, e, uids, lam=0.05)
        dev_a = setpo.setpo_advantages(r.to(device), e.to(device), uids, lam=0.05)
        assert dev_a.device.type == torch.device(device).type, f"result on {dev_a.device}, not {device}"
        if dtype == torch.bfloat16:  # bf16 embeddings: the advantages (and s) are float32
            assert dev_a.dtype == torch.float32 and dev_s.dtype == torch.float32, (dev_a.dtype, dev_s.dtype)
        err_s = float((dev_s.cpu() - cpu_s).abs().max())
        err_a = float((dev_a.cpu() - cpu_a).abs().max())
        assert err_s <= tol and err_a <= tol, f"{dtype}: max |cuda - cpu| = {err_s:.2e} (s), {err_a:.2e} (adv)"
        # contiguous groups on the device take the reshape path: the same numbers
        n = (len(uids) // 6) * 6
        cont = float((setpo.diversity_marginals(e[:n].to(device), group_size=6).cpu()
                      - setpo.diversity_marginals(e[:n], group_size=6)).abs().max())
        assert cont <= tol, f"{dtype}: contiguous groups, max |cuda - cpu| = {cont:.2e}"
        out[str(dtype)] = {"rows": len(uids), "max_err_marginals": err_s, "max_err_advantages": err_a,
                           "max_err_contiguous": cont, "advantage_dtype": str(dev_a.dtype)}
    return out


def check_verl(device: str) -> dict:
    import torch

    stubbed = stub_missing_ray()
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    import setpo
    import setpo.verl as sv

    uids, r, e = ragged_batch(1, torch.float32)
    length = 12
    mask = torch.ones(len(uids), length)
    token_rewards = torch.zeros(len(uids), length)
    token_rewards[:, -1] = r
    fn = core_algos.get_adv_estimator_fn("setpo")
    cfg = OmegaConf.create({"setpo": {"lam": 0.1}})
    with sv.batch_embeddings(e.to(device), uids=uids):
        adv, _ = fn(token_level_rewards=token_rewards.to(device), response_mask=mask.to(device), index=uids, config=cfg)
    expected = setpo.setpo_advantages(r, e, uids, lam=0.1)
    err = float((adv[:, -1].cpu() - expected).abs().max())
    assert adv.device.type == torch.device(device).type and err <= 1e-5, f"verl estimator: max err {err:.2e}"
    return {"verl_estimator_max_err": err, "ray": "stubbed (not installed)" if stubbed else "installed"}


def _tiny_embedder_shape():
    import paper_shapes as ps

    return ps.QWEN3_EMBEDDING_0_6B.scaled(hidden=64, layers=2, heads=4, kv_heads=2, vocab=512)


def _minilm_path():
    """The packaged all-MiniLM-L6-v2 folder, or None when its package is not installed (the bare machine)."""
    from setpo.embed import default_model_path

    try:
        return default_model_path()
    except (ValueError, FileNotFoundError, ImportError):
        return None


def check_embedders(device: str) -> dict:
    import paper_shapes as ps
    import torch

    stub_missing_ray()  # setpo.verl imports verl
    import setpo.verl as sv
    from setpo.embed import SentenceTransformerEmbedder

    texts = [" ".join(f"w{(i * 7 + j * 13) % 500 + 3}" for j in range(10 + i)) for i in range(40)]
    path = _minilm_path()
    if path is not None:
        name = "all-MiniLM-L6-v2"
        cpu = SentenceTransformerEmbedder(path, device="cpu")(texts)
        dev = SentenceTransformerEmbedder(path, device=device)(texts)
        threshold = 0.999
    else:  # bare machine: no model files; the same code path with a random Qwen3-shaped encoder
        name = "random Qwen3-shaped encoder (bf16 on CUDA vs float32 on the CPU)"
        cpu = ps.RandomEmbedder(_tiny_embedder_shape(), device="cpu")(texts)
        dev = ps.RandomEmbedder(_tiny_embedder_shape(), device=device, init_device="cpu")(texts)
        threshold = 0.99
    cos = float(torch.nn.functional.cosine_similarity(cpu, dev, dim=1).min())
    assert cos > threshold, f"{name} on {device} vs CPU: min row cosine {cos:.5f}"
    resolved = sv.resolve_device("auto")
    assert resolved == ("cuda" if device == "cuda" else "cpu"), f"embedding_device auto resolved to {resolved}"
    settings = sv.SetPOVerlSettings(lam=0.05, embedding_model="default" if path else "hash", embedding_device="auto")
    plug = sv.embedder_from_settings(settings)(texts)
    assert plug.shape[0] == len(texts) and bool(torch.isfinite(plug).all())
    return {"embedder": name, "min_row_cosine": cos, "plugin_device": resolved,
            "plugin_embedder": settings.embedding_model}


def check_training(device: str, run_root: Path) -> dict:
    import torch

    from setpo.embed import load_embedder
    from setpo.studies import math as ml
    from setpo.trl import quiet_libraries

    quiet_libraries()
    spec = "default" if _minilm_path() is not None else "hash"
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
    probes = {label: ml.read_probes(f.parent / "probes.jsonl") for label, f in finals.items()}
    try:
        import plotly  # noqa: F401

        _, data = ml.trajectory_figure(probes, embedder, method="pca")
        assert data["steps"] == [0, 2, 3], data["steps"]
        out["trajectory_points"] = sum(len(v["xy"]) for v in data["points"].values())
    except ImportError:  # the bare machine has no plotly: check the projection the figure is drawn from
        from setpo.studies.figures import project_texts

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
    from setpo.verl.launch import cpu_demo_command

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
    status, output, left = run_in_session(cmd, VERL_E2E_TIMEOUT_S, cwd=ROOT, env=env)
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


def _time_interleaved(fns: dict, repeats: int, sync) -> dict:
    for fn in fns.values():
        fn()
    sync()
    times = {k: [] for k in fns}
    for r in range(repeats):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def check_floor(device: str, tiny: bool) -> dict:
    """setpo_advantages against one torch.bmm forming the Gram matrices, contiguous and shuffled groups."""
    import numpy as np
    import torch

    import setpo

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    shapes = [(8, 4, 32), (16, 8, 64)] if tiny else [(512, 16, 1024), (1024, 64, 4096)]
    rows = []
    for b, g, d in shapes:
        gen = torch.Generator().manual_seed(0)
        emb = torch.randn(b * g, d, generator=gen).to(device)
        rewards = torch.randint(0, 2, (b * g,), generator=gen).float().to(device)
        grouped = emb.view(b, g, d)
        perm = torch.randperm(b * g, generator=gen)
        index = np.repeat(np.arange(b), g)[perm.numpy()]
        e_perm, r_perm = emb[perm.to(device)], rewards[perm.to(device)]
        fns = {"setpo_advantages": lambda: setpo.setpo_advantages(rewards, emb, group_size=g),
               "shuffled uids": lambda: setpo.setpo_advantages(r_perm, e_perm, index),
               "bmm floor": lambda: torch.bmm(grouped, grouped.transpose(1, 2))}
        t = _time_interleaved(fns, 5 if tiny else 21, sync)
        rows.append({"B": b, "G": g, "d": d, **{f"{k} (ms)": round(v * 1e3, 3) for k, v in t.items()},
                     "setpo / floor": round(t["setpo_advantages"] / t["bmm floor"], 2),
                     "shuffled / contiguous": round(t["shuffled uids"] / t["setpo_advantages"], 2)})
    return {"rows": rows}


def check_overhead(device: str, tiny: bool) -> dict:
    """SetPO+GRPO over GRPO step time (TRL, interleaved) with paper-shaped random models."""
    import paper_shapes as ps
    import torch

    if tiny:
        vocab = 512
        policy = ps.QWEN25_MATH_1_5B.scaled(hidden=64, layers=2, heads=4, kv_heads=2, vocab=vocab)
        embedder_shape = _tiny_embedder_shape()
        st = ps.StepSetting(prompts_per_step=2, num_generations=3, micro_batch=6, max_completion_length=12,
                            prompt_length=8, steps=1, warmup=1, rounds=1)
    else:
        vocab = ps.QWEN25_MATH_1_5B.vocab
        policy, embedder_shape = ps.QWEN25_MATH_1_5B, ps.QWEN3_EMBEDDING_0_6B
        st = ps.StepSetting(prompts_per_step=8, num_generations=6, micro_batch=24, max_completion_length=756,
                            prompt_length=128, steps=2, warmup=1, rounds=1)
    left = BUDGET_S - elapsed()
    if not tiny and left < 200:
        return {"skipped": f"{elapsed():.0f} s used, {left:.0f} s left: not enough for the paper-shaped steps"}
    tok = ps.word_tokenizer(vocab)
    embedder = ps.RandomEmbedder(embedder_shape, device=device, micro_batch=32)
    with tempfile.TemporaryDirectory() as tmp:
        ps.build_policy(policy, tok, Path(tmp) / "policy", device=device)
        res = ps.step_times(Path(tmp) / "policy", tok, embedder, st, device=device)
    embed_s = ps.embed_seconds(embedder, st.prompts_per_step * st.num_generations, st.max_completion_length, vocab)
    res["embed_s_alone"] = round(embed_s, 4)
    res["shapes"] = {"policy": vars(policy), "embedder": vars(embedder_shape)}
    del embedder
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------------------------------------------ report


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}", "",
             f"torch {report['torch']}, transformers {report.get('transformers')}, Python {report['python']}; "
             f"{'tiny shapes (dry run)' if report['tiny'] else 'full shapes'}; total {report['total_s']} s.", "",
             "| check | result | seconds |", "|---|---|---|"]
    for name, c in report["checks"].items():
        result = ("FAILED: " + c.get("error", "")[:120] if not c["ok"]
                  else "skipped: " + c["skipped"] if c.get("skipped") else "ok")
        lines.append(f"| {name} | {result} | {c['seconds']} |")
    floor = report["checks"].get("floor", {})
    if floor.get("ok"):
        lines += ["", "## Estimator against its floor (one torch.bmm forming the Gram matrices)", "",
                  "| B | G | d | setpo (ms) | shuffled (ms) | bmm floor (ms) | setpo / floor | shuffled / contiguous |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in floor["rows"]:
            lines.append(f"| {r['B']} | {r['G']} | {r['d']} | {r['setpo_advantages (ms)']} | {r['shuffled uids (ms)']} "
                         f"| {r['bmm floor (ms)']} | {r['setpo / floor']} | {r['shuffled / contiguous']} |")
    ov = report["checks"].get("overhead", {})
    if ov.get("ok") and "ratio" in ov:
        lines += ["", "## SetPO's step-time overhead (TRL, random paper-shaped models)", "",
                  f"policy {ov['policy_params'] / 1e6:,.1f}M params, embedder {ov['embedder_params'] / 1e6:,.1f}M; "
                  f"{ov['setting']['prompts_per_step']} prompts x G={ov['setting']['num_generations']}, responses up "
                  f"to {ov['setting']['max_completion_length']} tokens", "",
                  "| GRPO step (s) | SetPO+GRPO step (s) | ratio | embedding alone (s) |", "|---|---|---|---|",
                  f"| {ov['grpo_s']} | {ov['setpo_s']} | {ov['ratio']} | {ov['embed_s_alone']} |"]
    elif ov.get("skipped"):
        lines += ["", f"Overhead: {ov['skipped']}"]
    return "\n".join(lines) + "\n"


def run_checks(out_dir: Path, allow_cpu: bool, tiny: bool | None, only: list[str] | None) -> int:
    import torch

    if torch.cuda.is_available():
        device = "cuda"
    elif allow_cpu:
        device = "cpu"
    else:
        print("no CUDA device; pass --allow-cpu for a dry run", file=sys.stderr)
        return 2
    tiny = device == "cpu" if tiny is None else tiny
    if device == "cpu":
        torch.set_num_threads(1)  # a dry run; one thread keeps its timings sane on a shared machine
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    report: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({platform.processor()})",
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "python": platform.python_version(), "tiny": tiny, "checks": {}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        checks = {"estimator": lambda: check_estimator(device), "verl": lambda: check_verl(device),
                  "embedders": lambda: check_embedders(device), "training": lambda: check_training(device, Path(tmp)),
                  "floor": lambda: check_floor(device, tiny), "overhead": lambda: check_overhead(device, tiny),
                  "verl_e2e": lambda: check_verl_e2e(device, Path(tmp), requested=bool(only) and "verl_e2e" in only)}
        assert tuple(checks) == CHECKS
        for name, fn in checks.items():
            if only and name not in only:
                continue
            t0 = time.time()
            try:
                result = fn()
                report["checks"][name] = {"ok": True, "seconds": round(time.time() - t0, 1), **result}
            except Exception as err:  # noqa: BLE001 - report every check, then fail
                failed.append(name)
                report["checks"][name] = {"ok": False, "seconds": round(time.time() - t0, 1), "error": repr(err),
                                          "traceback": traceback.format_exc()[-4000:]}
            skipped = report["checks"][name].get("skipped")
            shown = "FAILED" if name in failed else f"skipped ({skipped})" if skipped else "ok"
            print(f"[{elapsed():6.1f} s] {name}: {shown}", flush=True)
    report["total_s"] = round(elapsed(), 1)
    report["passed"] = not failed
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"report: {out_dir / 'gpu_check.json'} and gpu_check.md")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("prepare", "install", "all", "run")
    command = argv.pop(0) if argv and argv[0] in commands else "run"
    ap = argparse.ArgumentParser(prog="gpu_check.py [prepare|install|all|run]", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", default=str(ROOT / "runs" / "gpu_wheels"),
                    help="the wheel folder prepare fills and install / all install from (default runs/gpu_wheels)")
    ap.add_argument("--python-versions", nargs="+", default=list(PYTHON_VERSIONS),
                    help="prepare: the Python versions to fetch compiled wheels for (default: 3.11 3.12)")
    ap.add_argument("--platform", help="prepare: pip's --platform tag (e.g. manylinux_2_28_x86_64)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"),
                    help="folder for gpu_check.json and gpu_check.md (default: $OUT or runs/gpu_check)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run every check on the CPU: a dry run of the script with tiny shapes (CUDA comparisons "
                         "compare the CPU with itself)")
    ap.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                    help="tiny shapes for the floor and overhead measurements (default: on the CPU only)")
    ap.add_argument("--only", nargs="+", choices=list(CHECKS),
                    help="run only these checks")
    args = ap.parse_args(argv)
    wheels = Path(args.wheels)
    if command == "prepare":
        return prepare(wheels, args.python_versions, args.platform)
    if command == "install":
        return install(wheels)
    if command == "all":
        rc = install(wheels)
        if rc:
            return rc
        # a fresh process, so that the check imports what was just installed
        rest = ["--out", args.out, *(["--allow-cpu"] if args.allow_cpu else []),
                *([] if args.tiny is None else ["--tiny" if args.tiny else "--no-tiny"]),
                *(["--only", *args.only] if args.only else [])]
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), "run", *rest]).returncode
    return run_checks(Path(args.out), args.allow_cpu, args.tiny, args.only)


if __name__ == "__main__":
    sys.exit(main())
