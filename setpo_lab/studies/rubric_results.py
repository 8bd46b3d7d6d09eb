"""The figures and tables of notebook 05 (SetGRPO on two noisy graders), drawn from ``setpo_lab.studies.rubric``'s
results: the graders' gaps, training dynamics, coverage and reversal risk, positive-affine invariance, and the
comparison's table (``format_table``).

Every figure is a plotly Figure for ``setpo_lab.studies.figures.save_figure`` (HTML, PNG twin, run record).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from setpo.envs.rubric import RubricTask
from setpo_lab.studies.figures import line_grid, seed_band

METHODS = (("grpo", "GRPO", "#7f7f7f"), ("grpo_matched", "GRPO, same grader budget", "#1f77b4"),
           ("setgrpo", "SetGRPO", "#d62728"))


def graders_table(task_config, seed: int = 0) -> str:
    """Mean |A − B| between the two graders and mean |A − q| to the latent quality, on clear and ambiguous prompts."""
    task = RubricTask(task_config, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.arange(task_config.n_prompts).repeat_interleave(task_config.n_responses)
    responses = torch.arange(task_config.n_responses).repeat(task_config.n_prompts)
    scores = task.grade(prompts, responses, gen)
    quality = task.quality[prompts, responses]
    amb = task.ambiguous[prompts]
    return "\n".join(["| prompts | mean \\|A − B\\| | mean \\|A − q\\| |", "|---|---:|---:|"]
                     + [f"| {name} | {(scores[mask, 0] - scores[mask, 1]).abs().mean():.3f} | "
                        f"{(scores[mask, 0] - quality[mask]).abs().mean():.3f} |"
                        for name, mask in (("clear", ~amb), ("ambiguous", amb))])


def setgrpo_training_figure(rows: Sequence[dict], smooth: int = 9):
    """The paper's Figures 3 and 5 in miniature: true-quality reward, SetGRPO's accepted-group ratio and mean
    recovery ratio η*, and the RMS coefficient per step; means over seeds with ± one standard error."""
    def line(method, key, s=1, band=True):
        label, colour = next((lab, c) for m, lab, c in METHODS if m == method)
        x, y, b = seed_band([r["history"][method][key] for r in rows], "se", s)
        return {"x": x, "y": y, "name": label, "color": colour, "band": b if band and len(rows) > 1 else None}

    best = sum(r["best"] for r in rows) / len(rows)
    panels = [
        {"title": "true-quality reward", "lines": [line(m, "true_quality") for m, _, _ in METHODS],
         "hlines": [{"y": best, "name": "optimum", "color": "black"}]},
        {"title": "accepted-group ratio (SetGRPO)", "lines": [line("setgrpo", "accepted_ratio", smooth)]},
        {"title": "mean recovery ratio η* (accepted groups)", "lines": [line("setgrpo", "mean_recovery_ratio",
                                                                             band=False)]},
        {"title": "coefficient norm (RMS per step)", "lines": [line(m, "coef_norm", smooth) for m, _, _ in METHODS]},
    ]
    return line_grid(panels, cols=2, x_title="step", panel_px=(520, 300),
                     title=f"GRPO vs SetGRPO on two noisy graders: means over {len(rows)} seed(s), bands ± one "
                           "standard error")


def coverage_risk_figure(coverage: Sequence[dict], risks: Sequence[dict]):
    """Left: the joint box's empirical coverage against 1 − α and its finite-sample ceiling. Right: the
    direction-reversal rate of plain GRPO and of the groups SetGRPO accepts and rejects, per seed, against β."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["joint coefficient box", "reversal risk on fresh groups"],
                        horizontal_spacing=0.12)
    alphas = [r["alpha"] for r in coverage]
    for key, name, style in (("target", "1 − α", dict(color="black", dash="dash")),
                             ("upper", "1 − α + 1/(n+1)", dict(color="black", dash="dot")),
                             ("coverage", "empirical coverage", dict(color="#d62728"))):
        fig.add_trace(go.Scatter(x=alphas, y=[r[key] for r in coverage], name=name, line=style,
                                 mode="lines+markers" if key == "coverage" else "lines"), row=1, col=1)
    labels = ["plain GRPO", "SetGRPO accepted", "SetGRPO rejected"]
    for k, r in enumerate(risks):
        fig.add_trace(go.Bar(x=labels, y=[r["risk_plain_grpo"], r["risk_accepted"], r["risk_rejected"]],
                             name=f"seed {k}: τ = {r['tau']:.3g}, {100 * r['accepted']:.0f}% accepted"), row=1, col=2)
    fig.add_hline(y=risks[0]["beta"], line=dict(color="red", dash="dash", width=1), row=1, col=2)
    top = max(max(r["risk_plain_grpo"], r["risk_rejected"]) for r in risks)
    fig.update_xaxes(title_text="α", row=1, col=1)
    fig.update_yaxes(title_text="coverage", row=1, col=1)
    fig.update_yaxes(title_text=f"direction-reversal rate (red dashes: β = {risks[0]['beta']:g})",
                     range=[0, 1.3 * max(top, 0.08)], row=1, col=2)
    fig.update_layout(barmode="group", width=1150, height=460, template="plotly_white",
                      title="Coverage and risk (the paper's Figure 9 in miniature)")
    return fig


def invariance_markdown(rows: Sequence[dict]) -> str:
    """``invariance_table``'s rows as markdown: cosines of coefficients and updates, gate flips, |Δη*|."""
    return "\n".join(["| transform | coeff. cosine | update cosine | flip (%) | \\|Δη*\\| (1e-3) |",
                      "|---|---:|---:|---:|---:|"]
                     + [f"| a = {r['a']:g}, b = {r['b']:g} | {r['coef_cosine']:.4f} | {r['update_cosine']:.4f} | "
                        f"{r['flip_pct']:.2f} | {r['d_eta_1e3']:.1f} |" for r in rows])


def format_table(rows: list[dict]) -> str:
    """Markdown table of ``compare_methods`` rows, with means, the standard error of the gain and the win count."""
    k = rows[0]["matched_gradings"]
    lines = [f"| seed | GRPO | GRPO, {k} gradings/grader | SetGRPO | SetGRPO − GRPO | optimum | "
             "SetGRPO accepted groups |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['grpo']:.4f} | {r['grpo_matched']:.4f} | {r['setgrpo']:.4f} | "
              f"{r['gain']:+.4f} | {r['best']:.4f} | {r['accepted']:.2f} |" for r in rows]
    n = len(rows)
    mean = lambda key: sum(r[key] for r in rows) / n  # noqa: E731
    se = math.sqrt(sum((r["gain"] - mean("gain")) ** 2 for r in rows) / max(n - 1, 1) / n)
    calls = [sum(r["calls"][i] for r in rows) / n for i in range(3)]
    lines += [f"| mean | {mean('grpo'):.4f} | {mean('grpo_matched'):.4f} | {mean('setgrpo'):.4f} | "
              f"{mean('gain'):+.4f} ± {se:.4f} | {mean('best'):.4f} | {mean('accepted'):.2f} |",
              "",
              f"Final true-quality reward (exact expectation over prompts). SetGRPO above GRPO in "
              f"{sum(r['gain'] > 0 for r in rows)} of {n} seeds, above budget-matched GRPO in "
              f"{sum(r['setgrpo'] > r['grpo_matched'] for r in rows)} of {n}. Grader calls per run: "
              f"GRPO {calls[0]:.0f}, matched GRPO {calls[1]:.0f}, SetGRPO {calls[2]:.0f} (calibration "
              f"included). ± is one standard error over seeds."]
    return "\n".join(lines)
