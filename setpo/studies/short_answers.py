"""The short-answer study's first stage: how the base model does on each task kind of ``envs.short_answers``.

A task family is in a model's competence zone when RL has a signal from the first step: a mean reward between
about 0.15 and 0.6, and most groups of G rollouts mixed (some right, some wrong), since a group whose rollouts
all score alike gets advantage 0 under GRPO. ``base_table`` measures, per task kind and sampling temperature,
on ``per_kind`` training prompts × ``n`` samples of the base model:

- ``reward``: the mean 0/1 reward;
- ``mixed_groups``: the expected share of prompts whose group of ``group_size`` rollouts (drawn from the n
  samples without replacement) holds both a right and a wrong answer;
- ``distinct_right``: distinct right answers per prompt among the n samples (for many-answer kinds the
  quantity that mode collapse lowers);
- ``answer_line``: the share of samples whose first line is ``Answer: N`` (right or wrong);
- ``truncated``: the share of samples that reached ``max_new_tokens`` without ending (re-tokenised text).

``python -m setpo.studies.short_answers base --out results/short_answers`` writes ``base_model.json`` (every
number and the settings) and ``base_model.md`` (the table). Samples of each (kind, temperature) are kept in
``OUT/base_samples/`` as they finish, so a stopped run resumes where it was; the folder is claimed for one
configuration (``setpo.studies.stages.claim_folder``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.short_answers import KINDS, TaskSpec, parse_answer, sample_tasks, task_messages
from setpo.studies.stages import claim_folder, print_flushed


@dataclass(frozen=True)
class BaseTableConfig:
    """What ``base_table`` measures.

    model_path: a local model folder; None: the packaged SmolLM2-135M-Instruct (``setpo.models``).
    kinds: task kinds of ``envs.short_answers``. per_kind: training prompts per kind. n: samples per prompt.
    temperatures: sampling temperatures (top-p 1). max_new_tokens: the completion limit.
    group_size: G of ``mixed_groups``. seed: prompt draw and sampling seed.
    """

    model_path: str | None = None
    kinds: tuple[str, ...] = KINDS
    per_kind: int = 24
    n: int = 16
    temperatures: tuple[float, ...] = (0.7, 1.0)
    max_new_tokens: int = 24
    group_size: int = 8
    seed: int = 0
    split: str = field(default="train")


def mixed_share(n: int, right: int, g: int) -> float:
    """Probability that g of n samples drawn without replacement, ``right`` of them right, are not all alike."""
    if g > n:
        raise ValueError(f"group_size {g} exceeds the {n} samples per prompt")
    alike = math.comb(right, g) + math.comb(n - right, g)
    return 1.0 - alike / math.comb(n, g)


def kind_row(tasks: list[TaskSpec], samples: list[list[str]], lengths: list[list[int]], cfg: BaseTableConfig) -> dict:
    """One row of the table: a kind's numbers over its prompts' samples (texts and their token counts)."""
    rewards, distinct, mixed, answered, cut = [], [], [], 0, 0
    for task, texts, lens in zip(tasks, samples, lengths, strict=True):
        values = [parse_answer(t) for t in texts]
        right = [task.is_right(v) for v in values]
        rewards += right
        distinct.append(len({v for v, ok in zip(values, right) if ok}))
        mixed.append(mixed_share(len(texts), sum(right), cfg.group_size))
        answered += sum(v is not None for v in values)
        cut += sum(k >= cfg.max_new_tokens for k in lens)
    count = len(rewards)
    return {"prompts": len(tasks), "samples": count, "reward": sum(rewards) / count,
            "mixed_groups": sum(mixed) / len(mixed), "distinct_right": sum(distinct) / len(distinct),
            "answer_line": answered / count, "truncated": cut / count}


def base_table(cfg: BaseTableConfig, out: str | Path, *, log=print_flushed) -> dict:
    """Measure the base model on every kind at every temperature (see the module docstring); returns the record
    that ``base_model.json`` holds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # the engine, once a model is loaded

    from setpo.studies.sampling import sample_completions

    out = Path(out)
    claim_folder(out / "base_samples", asdict(cfg))
    model_dir = Path(cfg.model_path) if cfg.model_path else _packaged_model()
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)
    rows = []
    for temperature in cfg.temperatures:
        for kind in cfg.kinds:
            tasks = sample_tasks([kind], cfg.split, cfg.per_kind, cfg.seed)
            cache = out / "base_samples" / f"{kind}_T{temperature}.json"
            if cache.exists():
                samples = json.loads(cache.read_text())["samples"]
            else:
                started = time.perf_counter()
                prompts = [tok.apply_chat_template(task_messages(t), tokenize=False, add_generation_prompt=True)
                           for t in tasks]
                samples = sample_completions(model, tok, prompts, n=cfg.n, temperature=temperature,
                                             max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                             add_special_tokens=False, share_prompt=True)
                cache.write_text(json.dumps({"questions": [t.question for t in tasks], "samples": samples,
                                             "seconds": time.perf_counter() - started}))
            lengths = [[len(tok(s, add_special_tokens=False)["input_ids"]) for s in texts] for texts in samples]
            row = {"kind": kind, "temperature": temperature, **kind_row(tasks, samples, lengths, cfg)}
            log(f"T={temperature} {kind}: reward {row['reward']:.2f}, mixed groups {row['mixed_groups']:.2f}, "
                f"distinct right {row['distinct_right']:.1f}, truncated {row['truncated']:.2f}")
            rows.append(row)
    record = {"config": asdict(cfg), "model": str(model_dir), "rows": rows,
              "command": "python -m setpo.studies.short_answers base --out " + str(out)}
    (out / "base_model.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "base_model.md").write_text(base_table_markdown(record))
    return record


def base_table_markdown(record: dict) -> str:
    cfg = record["config"]
    lines = [f"Base model on the short-answer tasks: {cfg['per_kind']} {cfg['split']} prompts per kind × "
             f"{cfg['n']} samples, at most {cfg['max_new_tokens']} new tokens, mixed groups at G = "
             f"{cfg['group_size']}. Made by `{record['command']}`.", "",
             "| kind | T | reward | mixed groups | distinct right / prompt | answer line | truncated |",
             "|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        lines.append(f"| {r['kind']} | {r['temperature']} | {r['reward']:.2f} | {r['mixed_groups']:.2f} | "
                     f"{r['distinct_right']:.1f} | {r['answer_line']:.2f} | {r['truncated']:.2f} |")
    return "\n".join(lines) + "\n"


def _packaged_model() -> Path:
    from setpo.models import prepared_folder

    return prepared_folder(log=lambda *_: None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m setpo.studies.short_answers", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    base = sub.add_parser("base", help="measure the base model on every task kind (base_model.json / .md)")
    base.add_argument("--out", required=True, help="folder for base_model.json, base_model.md and the samples")
    base.add_argument("--model-path", default=None, help="a local model folder (default: the packaged SmolLM2)")
    base.add_argument("--per-kind", type=int, default=BaseTableConfig.per_kind)
    base.add_argument("--n", type=int, default=BaseTableConfig.n)
    args = ap.parse_args(argv)
    base_table(BaseTableConfig(model_path=args.model_path, per_kind=args.per_kind, n=args.n), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
