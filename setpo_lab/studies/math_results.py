"""Reading the math study (notebook 06): its figures and tables, each drawn from what the runs wrote (probe
records, ``log_history.json``, evaluation results), with the shared builders of ``setpo_lab.studies.figures``.

- ``pass_at_k_table``: the large-budget pass@k comparison against the base model (its figure:
  ``figures.models_pass_at_k_figure``, any study's pass@k per model);
- reward, within-group similarity and distinct correct responses over training: ``figures.trainer_log_figure`` (any
  run's ``log_history.json``);
- where the responses to fixed prompts go over training: ``figures.probe_trajectory_figure`` (any study's probes);
- ``results_table``: Pass@1 as avg@k per run and data source (and the judged diversity, with a judge);
  ``config_record``: the record beside a figure; ``results_record`` (written by ``math._write_results``): the
  record beside the results table, and the table and record of ``python -m setpo_lab run math`` (``run_dir/results.md``, ``.json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from setpo.metrics import pass_at_k
from setpo.records import markdown_table, read_json
from setpo_lab.studies.figures import embedder_name, run_record
from setpo_lab.studies.intervals import interval_side, interval_text, paired_ci
from setpo_lab.studies.judging import JUDGED_COLUMN, judged_cell, judged_note, without_judge
from setpo_lab.studies.math_config import MathRunConfig
from setpo_lab.studies.stages import sittings_seconds


def pass_at_k_table(results: Mapping[str, dict], ks: Sequence[int] = (1, 4, 16, 64, 256)) -> str:
    """pass@k in % per model (rows) at the given k (columns, those within the sampled n), as markdown."""
    k_max = min(len(r["pass_at_k"]) for r in results.values())
    ks = [k for k in ks if k <= k_max] or [k_max]
    return markdown_table([{"model": label, **{f"pass@{k}": f"{100 * r['pass_at_k'][k - 1]:.1f}" for k in ks}}
                           for label, r in results.items()])


def results_table(results: Mapping[str, dict], eval_k: int, note: str = "", judged: Mapping | None = None) -> str:
    """Pass@1 as avg@k per run (rows) and data source (columns), in %, as markdown. judged: stage "judge"'s
    record (``math.judge_runs``), which adds the judged diversity column (mean [95% CI], missing count) and
    a line naming the judge and prompt version; None: the table without them."""
    sources = sorted({s for r in results.values() for s in r["per_source"]})
    rows = [{"run": label, **{s: f"{100 * r['per_source'][s]:.1f}" for s in sources},
             f"all (avg@{eval_k})": f"{100 * r['avg_at_k']:.1f}"} for label, r in results.items()]
    if judged is not None:
        for row in rows:
            row[JUDGED_COLUMN] = judged_cell(judged["methods"].get(row["run"]))
        note = " ".join(filter(None, [judged_note(judged), note]))
    return markdown_table(rows) + (f"\n\n*{note}*" if note else "")


def config_record(cfg: MathRunConfig, command: str = "notebooks/06_qwen_math_gpu", **extra) -> dict:
    """The run record of a notebook-06 figure: config, seed, model, embedder and data by name."""
    uses = {"embedder": embedder_name(cfg.embedder),
            "model": (cfg.model_path or (cfg.packaged_model and f"{cfg.packaged_model} (setpo.models)")
                      or "tiny random Qwen2 (setpo.trl.tiny_models; numbers mean nothing)"),
            "train data": cfg.train_file or "generated (setpo.envs.math.smoke_problems)",
            "validation data": cfg.val_file or "generated (setpo.envs.math.smoke_problems)",
            "pass@k data": cfg.passk_file or "generated (setpo.envs.math.smoke_problems)",
            "generation": "vLLM" if cfg.uses_vllm() else "transformers generate"}
    return run_record(command, config=without_judge(vars(cfg)), seeds=[cfg.seed], uses=uses, **extra)


def probe_similarity(probes_by_run: Mapping[str, Sequence[dict]], embedder) -> dict[str, dict[int, float]]:
    """How alike each run's responses to the same probe prompt are, step by step: run label -> {step: the mean
    cosine similarity of the responses to one prompt at that step, averaged over prompts}. Lower is more
    diverse; a collapsing policy's similarity climbs towards 1. embedder: texts -> (N, d) tensor."""
    import torch  # the engine, imported when the reading is drawn

    out: dict[str, dict[int, float]] = {}
    for label, records in probes_by_run.items():
        sets: dict[tuple[int, int], list[str]] = {}
        for r in records:
            sets.setdefault((int(r["step"]), r["probe"]), []).append(r["text"])
        by_step: dict[int, list[float]] = {}
        for (step, _), texts in sorted(sets.items()):
            if len(texts) < 2:
                continue
            e = torch.nn.functional.normalize(embedder(texts).float(), dim=-1)
            sim = e @ e.T
            by_step.setdefault(step, []).append(float((sim.sum() - sim.diagonal().sum())
                                                      / (len(texts) * (len(texts) - 1))))
        out[label] = {step: sum(v) / len(v) for step, v in sorted(by_step.items())}
    return out


def similarity_table(similarity: Mapping[str, Mapping[int, float]]) -> str:
    """``probe_similarity`` as markdown: per run, the similarity at its first and last probe and the change."""
    rows = []
    for label, by_step in similarity.items():
        if not by_step:
            continue
        (s0, v0), (s1, v1) = next(iter(by_step.items())), list(by_step.items())[-1]
        rows.append({"run": label, "first probe": f"{v0:.3f} (step {s0})", "last probe": f"{v1:.3f} (step {s1})",
                     "change": f"{v1 - v0:+.3f}"})
    return markdown_table(rows)


def _processor() -> str:
    """Where this process samples: "GPU", or "CPU, <n> threads"."""
    import torch

    return "GPU" if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"


def _run_seconds(run_dir: str | Path) -> float:
    """A finished run's training time in seconds over all its sittings (``sittings.json``, which the training's
    heartbeat keeps), else its last sitting's (``final/done.json``)."""
    clock = Path(run_dir) / "sittings.json"
    if clock.is_file():
        return sittings_seconds(clock)
    return float(read_json(Path(run_dir) / "final" / "done.json", "delete the run folder and rerun")["seconds"])


MOVED = {"above 0": "up", "below 0": "down", "spans 0": "no detectable change"}


def _moved(d: dict) -> str:
    """A paired difference in words: which way it moved, or no detectable change, with its interval."""
    text = interval_text(d, "{:+.1f}", scale=100, unit=" points", alone=" (one problem: no interval)")
    side = interval_side(d)
    return text if side is None else f"{MOVED[side]}, {text}"


TRAINING_SIGNAL_KEYS = {"reward": "reward", "clipped": "completions/clipped_ratio"}


def _training_signal(run_dirs: Mapping[str, str | Path]) -> dict[str, dict[str, list[float]]]:
    """Each run's mean reward and fraction of rollouts cut at the length limit, per training step, as
    ``SetPOTrainer`` logged them (``log_history.json``): label -> {"reward": [...], "clipped": [...]}."""
    out = {}
    for label, d in run_dirs.items():
        history = read_json(Path(d) / "log_history.json", "delete the run folder and rerun to train it again")
        out[label] = {name: [h[key] for h in history if h.get(key) is not None]
                      for name, key in TRAINING_SIGNAL_KEYS.items()}
    return out


def math_reading(cfg: MathRunConfig, passk: Mapping[str, dict], diffs: Sequence[dict],
                 similarity: Mapping[str, Mapping[int, float]], run_dirs: Mapping[str, str | Path]) -> str:
    """Notebook 06's closing text, written from its numbers: the base model's coverage at small and large k, how
    much reward each run (label -> its folder in ``run_dirs``) saw in training and how many rollouts the length
    limit cut (``_training_signal``), whether its model moved at all (an evaluation ``same_model_as`` another),
    what each run did to pass@1 and pass@n against the base model and against the baseline
    (``paired_differences``), what the probe similarities did, and what the runs cost (``_run_seconds``).
    Markdown."""
    train_minutes = {label: _run_seconds(d) / 60 for label, d in run_dirs.items()}
    base = passk["base model"]
    n, problems = base["k"], base["n_problems"]
    mid = min(16, n)
    lines = (["**Tiny random model:** every number here means nothing; the text shows what the real run writes."]
             if cfg.tiny else [])
    lines.append(f"- **The base model** ({problems} problems, n = {n} samples each): pass@1 "
                 f"{100 * base['pass_at_k'][0]:.1f}%, pass@{mid} {100 * base['pass_at_k'][mid - 1]:.1f}%, "
                 f"pass@{n} {100 * base['pass_at_k'][n - 1]:.1f}%: "
                 f"{sum(c > 0 for c in base['correct'])} of {problems} problems solved at least once.")
    for label, signal in _training_signal(run_dirs).items():
        rewards, clipped = signal["reward"], signal.get("clipped") or []
        rewarded = sum(r > 0 for r in rewards)
        lines.append(f"- **{label}** in training: mean reward {sum(rewards) / max(len(rewards), 1):.3f}; "
                     f"{rewarded} of {len(rewards)} steps had a right rollout"
                     + (" (with every reward 0 every group advantage is 0: only a SetPO term, where there is one, "
                        "moves the model)" if not rewarded else "")
                     + (f"; {100 * sum(clipped) / len(clipped):.0f}% of rollouts were cut at "
                        f"{cfg.max_completion_length} tokens" if clipped else "") + ".")
    lines += [f"- **{label}** after training is the {r['same_model_as']}, bit for bit (weights, tokenizer and stop "
              f"ids): training never changed it, so its evaluation is the {r['same_model_as']}'s and every "
              "difference between them is 0 by construction." for label, r in passk.items() if r.get("same_model_as")]
    lines += [f"- **{d['a']} − {d['b']}**, pass@{d['k']}: {_moved(d)}." for d in diffs if d["k"] in (1, n)]
    for label, by_step in similarity.items():
        if len(by_step) >= 2:
            (s0, v0), (s1, v1) = next(iter(by_step.items())), list(by_step.items())[-1]
            lines.append(f"- **{label}**, responses to one probe prompt: mean cosine similarity {v0:.3f} at step "
                         f"{s0}, {v1:.3f} at step {s1} ({v1 - v0:+.3f}).")
    evals = sum(r.get("seconds", 0.0) for r in passk.values()) / 60
    lines.append(f"- **Cost:** training {', '.join(f'{k} {v:.0f} min' for k, v in train_minutes.items())}; "
                 f"sampling the {len(passk)} evaluations {evals:.0f} min "
                 f"({_processor()}).")
    return "\n".join(lines)


def paired_differences(results: Mapping[str, dict], pairs: Sequence[tuple[str, str]],
                       ks: Sequence[int] = (1, 16, 256)) -> list[dict]:
    """Each pair (a, b) of models evaluated on the same problems: a − b in pass@k, paired over problems.

    results: label -> ``math.evaluate_avg_at_k``'s result (``correct``: right samples per problem, out of ``k``).
    Per problem, pass@k is the unbiased estimate from its n samples (``setpo.pass_at_k``); the difference is
    the mean over problems of a's minus b's, with the 95% t-interval over problems (``setpo_lab.studies.intervals
    .mean_ci``). Only k <= n. Returns [{"a", "b", "k", "mean", "lo", "hi", "n"}] with fractions, not %.
    """
    out = []
    for a, b in pairs:
        ra, rb = results[a], results[b]
        if ra["k"] != rb["k"] or ra["n_problems"] != rb["n_problems"]:
            raise ValueError(f"{a!r} and {b!r} were not evaluated alike: n = {ra['k']} vs {rb['k']} samples of "
                             f"{ra['n_problems']} vs {rb['n_problems']} problems")
        # ra["k"] == rb["k"] (checked above): one pass@k estimate serves both sides
        out += [{"a": a, "b": b, "k": k, **paired_ci(zip(ra["correct"], rb["correct"], strict=False),
                                                     lambda c, ra=ra, k=k: pass_at_k(ra["k"], int(c), k))}
                for k in ks if k <= ra["k"]]
    return out


def paired_table(diffs: Sequence[dict]) -> str:
    """``paired_differences`` as markdown: one row per pair, Δ pass@k in points with its 95% interval per k."""
    rows: dict[tuple[str, str], dict] = {}
    for d in diffs:
        row = rows.setdefault((d["a"], d["b"]), {"comparison": f"{d['a']} − {d['b']}"})
        row[f"Δ pass@{d['k']}"] = interval_text(d, "{:+.1f}", scale=100)
    n = diffs[0]["n"] if diffs else 0
    return (markdown_table(list(rows.values()))
            + f"\n\n*Points; mean over the {n} problems of the per-problem difference, 95% t-interval over problems.*")


def results_record(record: Mapping, results: Mapping[str, dict], judged: Mapping | None = None, **extra) -> dict:
    """The record beside the results table: ``record`` (``config_record``), every run's evaluation without its
    example texts, and the judged summaries when there is a judge (no judge: no judge key at all)."""
    return {**record, "results": {k: {kk: vv for kk, vv in r.items() if kk != "examples"} for k, r in results.items()},
            **extra, **({} if judged is None else {"judged": dict(judged)})}
