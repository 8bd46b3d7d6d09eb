"""Reading the toy study (notebook 01, ``make demo``): which correct modes a run keeps, the coverage tables,
and Figure 1 (trajectory embeddings and mode mass over training), saved as HTML + PNG twin + run record.
Every function here reads trained runs (``setpo_lab.studies.toy.ToyRun``: config, history, snapshots)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from setpo.envs.bandit import MultiModalBandit
from setpo.metrics import mode_coverage
from setpo_lab.studies.figures import SETPO_COLOURS, project_2d, run_record, save_figure
from setpo_lab.studies.figures import trajectory_figure


def _covered_modes(run, threshold: float = 0.05) -> list[int]:
    """Correct modes holding at least ``threshold`` of the final policy's exact mass (averaged over prompts)."""
    masses = run.history[-1]["mode_mass"]
    cov = mode_coverage(range(len(masses)), range(run.config.bandit.num_correct), threshold, weights=masses)
    return list(cov.covered)


def coverage_rows(results: dict[str, list], threshold: float = 0.05) -> list[dict]:
    """One row per (variant, seed): correct modes covered (≥ threshold mass), final correct mass, masses."""
    return [{"method": label, "seed": run.config.seed, "modes_covered": len(_covered_modes(run, threshold)),
             "correct_mass": round(run.history[-1]["correct_mass"], 3),
             "correct_mode_masses": [round(m, 2)
                                     for m in run.history[-1]["mode_mass"][: run.config.bandit.num_correct]]}
            for label, runs in results.items() for run in runs]


def summary_rows(results: dict[str, list], threshold: float = 0.05) -> list[dict]:
    out = []
    for label, runs in results.items():
        cov = [len(_covered_modes(r, threshold)) for r in runs]
        reward = sum(r.history[-1]["correct_mass"] for r in runs) / len(runs)
        out.append({"method": label, "seeds": len(runs), "modes covered per seed": cov, "min modes": min(cov),
                    "mean final reward": round(reward, 3)})
    return out


def _figure1(runs: dict, method: str = "umap", seed: int = 0, prompt: int = 0):
    """Figure 1: sampled trajectory embeddings over training (top) and mode mass over training (below), one
    column per run, stars at correct modes.

    runs: {label: ToyRun} trained on the same world. The projection is fitted once on the embeddings of every
    possible trajectory for ``prompt`` (the grey background), so panels and stages share coordinates; a sample
    is drawn at its trajectory's point plus a little jitter, so that density shows. A star sits at the mean
    position of its mode's trajectories. Returns (plotly figure, {"figure", "frame", ...}).
    """
    import pandas as pd  # a notebook (lab) dependency, imported when a figure is drawn

    world = MultiModalBandit(next(iter(runs.values())).config.bandit)
    c = world.config
    grid = torch.cartesian_prod(*[torch.arange(c.vocab_size)] * c.traj_len).reshape(-1, c.traj_len)
    grid_prompts = torch.full((len(grid),), prompt)
    grid_modes = world.modes(grid_prompts, grid).numpy()
    # UMAP's first call in a process compiles numba code (~15 s on 2 cores): say so, or the notebook falls silent
    print(f"Figure 1: projecting the embeddings of all {len(grid)} trajectories to 2-D with {method.upper()}"
          + (" (its first call compiles: ~15 s)" if method == "umap" else "") + " ...", end=" ", flush=True)
    started = time.perf_counter()
    xy_all = project_2d(world.embeddings(grid_prompts, grid).numpy(), method=method, seed=seed)
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    stars = np.stack([xy_all[grid_modes == m].mean(0) for m in range(c.num_modes)])
    correct = set(world.correct_modes)
    jitter_scale = 0.015 * np.ptp(xy_all, axis=0)
    rng = np.random.default_rng(seed)

    rows, curves = [], {}
    for label, run in runs.items():
        for snap in run.snapshots:
            keep = snap["prompts"] == prompt
            tokens, modes = snap["tokens"][keep], snap["modes"][keep].numpy()
            pts = xy_all[world.sequence_id(tokens).numpy()] + rng.normal(size=(len(tokens), 2)) * jitter_scale
            rows += [{"panel": label, "step": snap["step"], "x": x, "y": y, "correct": int(m) in correct,
                      "group": prompt, "hover": f"mode {m}{' (correct)' if m in correct else ''}"
                                                f"<br>tokens {' '.join(map(str, t.tolist()))}"}
                     for (x, y), m, t in zip(pts, modes, tokens, strict=True)]
        steps = [h["step"] for h in run.history]
        masses = np.asarray([h["mode_mass"] for h in run.history])
        curves[label] = [*({"x": steps, "y": masses[:, m], "name": f"correct mode {m}", "color": SETPO_COLOURS[m % 4]}
                           for m in sorted(correct)),
                         {"x": steps, "y": masses[:, len(correct):].sum(1), "name": "wrong modes", "color": "black",
                          "dash": "dash"},
                         {"x": [steps[0], steps[-1]], "y": [0.05, 0.05], "name": "5%: a mode counts as kept",
                          "color": "grey", "dash": "dot"}]
    frame = pd.DataFrame(rows)
    landmarks = [{"x": x, "y": y, "label": m, "correct": m in correct} for m, (x, y) in enumerate(stars)]
    fig = trajectory_figure(frame, background=xy_all, landmarks=landmarks, curves=curves,
                            curves_axes=("training step", "policy mass"), group_name="prompt",
                            title=f"Sampled trajectory embeddings over training ({method.upper()}; filled: correct "
                                  "mode, stars: correct modes), and each mode's probability mass")
    return fig, {"figure": fig, "frame": frame, "stars": stars, "correct": correct, "labels": list(runs),
                 "background": xy_all}


def _figure_record(results: dict[str, list], projection: str, command: str) -> dict:
    """The run record of Figure 1: the command, the first run's config, the seeds, each variant's settings and
    the coverage rows."""
    runs = next(iter(results.values()))
    return run_record(
        command, config=asdict(runs[0].config), seeds=[r.config.seed for r in runs],
        uses={"projection": projection},
        variants={label: {k: getattr(rs[0].config, k) for k in ("algo", "setpo", "lam")}
                  for label, rs in results.items()},
        projection=projection, rows=coverage_rows(results))


def write_figure1(results: dict[str, list], out_dir: Path, projection: str, command: str):
    """Figure 1 from each variant's first seed: .html, .png and a .json record of config, seeds and table.

    Returns (plotly figure, html path, png path). Used by `make demo` and notebook 01 alike.
    """
    fig, _ = _figure1({label: runs[0] for label, runs in results.items()}, method=projection)
    html, png = save_figure(fig, Path(out_dir) / "fig1_toy_mode_collapse",
                            _figure_record(results, projection, command))
    return fig, html, png
