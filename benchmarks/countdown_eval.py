"""Where one Countdown evaluation's time goes: the study's slowest stage (docs/reproducibility/countdown-history.md).

Notebook 03's warm start (results/countdown/sft/final, kept in git) samples 64 completions for each of the first
PROBLEMS test problems at T = 1, top-p 0.9, exactly as the study's evaluation does (``sample_eval``), then scores
them (``evaluate_samples``). Reported, from one run, as shares of its time (ratios, not seconds: the machine is
shared):
  sampling / scoring          the wall clock of generate against that of scoring the texts
  and, inside sampling, the operators' own CPU time (torch.profiler, self time) in three parts:
  nucleus sampling            sort, softmax, cumsum, scatter, masked_fill and the multinomial draw (top-p)
  model layers                linear layers, attention and the rest of the forward (every other aten operator)
The question it answers: could a faster evaluation change no result? The nucleus is decided by a cumulative sum in
sorted order and the draw by the exact probabilities, so a cheaper top-p would change which samples are drawn.
One thread. ``--smoke``: 2 problems x 4 samples.

Run: `make bench` (all benchmarks) or `python benchmarks/countdown_eval.py [--smoke] [--out DIR]`.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from harness import options, report
from setpo_lab import ROOT
from setpo.records import markdown_table

STUDY = ROOT / "results" / "countdown"
PROBLEMS = 64
SMOKE_PROBLEMS, SMOKE_SAMPLES = 2, 4
NUCLEUS_OPS = ("aten::sort", "aten::softmax", "aten::_softmax", "aten::cumsum", "aten::scatter", "aten::masked_fill",
               "aten::masked_fill_", "aten::multinomial", "aten::exponential_", "aten::div_", "aten::argmax")


def main(argv=None) -> str:
    args = options(__doc__, argv)
    from setpo_lab.studies.countdown import evaluate_samples, load_config, make_data, sample_eval

    model = STUDY / "sft" / "final"
    if not (model / "done.json").exists():
        raise FileNotFoundError(f"{model} is missing: it is kept in git (git checkout -- {model.relative_to(ROOT)})")
    torch.set_num_threads(1)
    cfg = load_config(STUDY)
    problems = make_data(cfg).test[:SMOKE_PROBLEMS if args.smoke else PROBLEMS]
    if args.smoke:
        cfg = replace(cfg, eval_samples=SMOKE_SAMPLES)
    sample_eval(cfg, model, problems[:1], 1.0)  # warm-up: loading, first call
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        samples = sample_eval(cfg, model, problems, 1.0)
    t1 = time.perf_counter()
    evaluate_samples(problems, samples)
    t2 = time.perf_counter()
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    aten = {k: v for k, v in ops.items() if k.startswith("aten::")}
    nucleus = sum(v for k, v in aten.items() if k in NUCLEUS_OPS)
    layers = sum(v for k, v in aten.items() if k not in NUCLEUS_OPS)
    top = sorted(aten.items(), key=lambda kv: -kv[1])[:8]
    rows = [{"part": "sampling (generate), wall clock", "share of the evaluation": f"{(t1 - t0) / (t2 - t0):.0%}"},
            {"part": "scoring the texts, wall clock", "share of the evaluation": f"{(t2 - t1) / (t2 - t0):.0%}"},
            {"part": "nucleus sampling operators (sort, softmax, cumsum, draw)",
             "share of the evaluation": f"{nucleus / (nucleus + layers):.0%} of sampling's operator time"},
            {"part": "model layers (every other operator)",
             "share of the evaluation": f"{layers / (nucleus + layers):.0%} of sampling's operator time"}]
    text = "\n".join([
        f"One Countdown evaluation of the warm start ({len(problems)} test problems x {cfg.eval_samples} samples, T = 1, "
        f"top-p {cfg.eval_top_p}, 1 thread; the study evaluates {cfg.n_test}).", "",
        markdown_table(rows), "",
        f"nucleus / model layers (operator time): {nucleus / layers:.2f}", "",
        "Largest operators (self CPU time, share of sampling's operator time):", "",
        markdown_table([{"operator": k, "share": f"{v / (nucleus + layers):.0%}"} for k, v in top])])
    report(args, "countdown_eval", text, {"problems": len(problems), "samples": cfg.eval_samples,
                                          "sampling_s": t1 - t0, "scoring_s": t2 - t1, "nucleus_us": nucleus,
                                          "layers_us": layers, "operators_us": dict(top)})
    return text


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
