"""Real responses of a real model, scored: the check of ``setpo.envs.math``'s answer extraction and ``math_reward`` on
what a model actually writes, as a committed table.

``python -m setpo_lab run math_responses --model-path DIR`` samples one response to each of the first ``n``
GSM8K test problems (``data/gsm8k/test.parquet``) with the Qwen-Math prompt through the model's chat template,
at the evaluation's sampling settings (``PAPER_RUN``: T = 0.5, top-p 0.9) and ``max_new_tokens`` tokens, and
writes ``OUT/real_responses.json`` (the config and the responses) and ``OUT/real_responses.md`` (reference,
extracted answer, reward, an excerpt of each response's end). Sampling is the slow part (2 cores: about a
minute per 20 responses of 256 tokens), so the responses are kept: a rerun with the same settings only scores
them again with the current checker (``--set resample=true`` samples anew), which is how a fix to the extraction shows
up in the table.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from setpo.envs.math import final_answer, load_math_problems, math_reward, qwen_math_messages
from setpo.presets import PAPER_RUN
from setpo_lab import ROOT
from setpo.records import markdown_table, read_json, write_json, write_text
from setpo_lab.studies.arguments import StudyCommand, check_fields, flags_as_set, run_command
from setpo_lab.studies.toolkit import chat_prompts

GSM8K_TEST = ROOT / "data" / "gsm8k" / "test.parquet"
#: characters of each response's end shown in the table (the answer sits at the end)
EXCERPT_CHARS = 160


def _sample_settings(model_path: str | Path, n: int, max_new_tokens: int, seed: int) -> dict:
    """What the sampled responses depend on (a rerun with other settings samples again)."""
    record = Path(model_path) / "setpo_model.json"
    remedy = "give an intact model folder (`python -m setpo.models prepare` makes one)"
    model = read_json(record, remedy, Path(model_path).parent).get("sha256") if record.is_file() else str(model_path)
    return {"model": model, "data": "data/gsm8k/test.parquet", "n": n, "max_new_tokens": max_new_tokens,
            "seed": seed, "temperature": PAPER_RUN.eval_temperature, "top_p": PAPER_RUN.eval_top_p}


def _sample(model_path: str | Path, settings: dict, log=print) -> list[str]:
    """One response per problem (the first ``settings['n']`` GSM8K test problems)."""
    import torch

    from setpo_lab.studies.math import load_model, load_tokenizer
    from setpo_lab.studies.sampling import sample_completions

    problems = load_math_problems(GSM8K_TEST, limit=settings["n"])
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, torch.float32)
    t0 = time.perf_counter()
    # the Qwen-Math chat template already holds the special tokens: the tokenizer adds none
    prompts = chat_prompts(tokenizer, [p.question for p in problems], qwen_math_messages)
    texts = sample_completions(model, tokenizer, prompts, 1, settings["temperature"], settings["top_p"],
                               settings["max_new_tokens"], seed=settings["seed"], batch_sequences=settings["n"],
                               add_special_tokens=False)
    log(f"sampled {len(texts)} responses in {time.perf_counter() - t0:.0f} s")
    return [t[0] for t in texts]


def _cell(text: str) -> str:
    """Text for one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _score_table(responses: list[str], n: int) -> tuple[list[dict], str]:
    """Rows (reference, extracted answer, reward, excerpt) and the markdown table, from the current checker."""
    problems = load_math_problems(GSM8K_TEST, limit=n)
    rows = [{"#": i, "reference": p.answer, "extracted": "—" if extracted is None else _cell(extracted),
             "reward": math_reward(text, p.answer), "tokens~": len(text.split()),
             "response (last characters)": _cell(("…" if len(text) > EXCERPT_CHARS else "") + text[-EXCERPT_CHARS:])}
            for i, (p, text, extracted) in enumerate(zip(problems, responses, map(final_answer, responses),
                                                         strict=True))]
    return rows, markdown_table(rows, fmt=lambda v: f"{v:g}" if isinstance(v, float) else str(v))


@dataclass(frozen=True)
class _ResponsesConfig:
    """What the table samples: one response to each of the first ``n`` GSM8K test problems, at most
    ``max_new_tokens`` tokens, seeded ``seed``, from the model folder ``model_path`` (``--model-path``); ``resample``:
    sample anew even when the kept responses match."""

    model_path: str | None = None
    n: int = 20
    max_new_tokens: int = 256
    seed: int = 0
    resample: bool = False

    def __post_init__(self):
        for name, low, high in (("n", 1, 1319), ("max_new_tokens", 1, 4096), ("seed", 0, 2**31 - 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
        check_fields(self, flag=("resample",))


def _write_table(cfg: _ResponsesConfig, out: str | Path) -> str:
    """Sample (or take the kept responses), score them with the current checker and write
    ``out/real_responses.json`` and ``out/real_responses.md``; returns the markdown."""
    model_path = cfg.model_path
    if not model_path or not Path(model_path).is_dir():
        where = f"no model folder at {str(model_path)!r}" if model_path else "no model folder given"
        raise ValueError(f"{where}: give --model-path DIR (make one with `python -m setpo.models prepare "
                         "smollm2-135m-instruct DIR`)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = _sample_settings(model_path, cfg.n, cfg.max_new_tokens, cfg.seed)
    kept = read_json(out / "real_responses.json") if (out / "real_responses.json").is_file() else None
    if kept is not None and kept.get("settings") == settings and not cfg.resample:
        responses, seconds = kept["responses"], kept["sample_seconds"]
    else:
        t0 = time.perf_counter()
        responses = _sample(model_path, settings)
        seconds = round(time.perf_counter() - t0, 1)
        write_json(out / "real_responses.json", {"settings": settings, "sample_seconds": seconds,
                                                 "responses": responses})
    rows, table = _score_table(responses, cfg.n)
    right = sum(r["reward"] for r in rows)
    found = sum(r["extracted"] != "—" for r in rows)
    text = (f"# Real responses on GSM8K test, scored by `setpo.envs.math`\n\n"
            f"Made by `{COMMAND.prog} --model-path <folder of smollm2-135m-instruct> --out {out} --set n={cfg.n} "
            f"max_new_tokens={cfg.max_new_tokens} seed={cfg.seed}` (model file SHA-256 `{settings['model']}`): one "
            f"response to each of the first {cfg.n} GSM8K test problems, Qwen-Math prompt through the model's chat "
            f"template, T = {settings['temperature']}, top-p {settings['top_p']}, at most {cfg.max_new_tokens} new "
            f"tokens (sampled in {seconds:.0f} s on the CPU; responses kept in `real_responses.json`, scored again "
            f"by each run). **{right:g} of {len(rows)} right; an answer extracted from {found}.** "
            f"\"extracted\" is `setpo.envs.math.final_answer`, what `math_reward` compares with the reference; "
            f"tokens~ counts words.\n\n{table}\n")
    write_text(out / "real_responses.md", text)
    return text


def _run(cfg: _ResponsesConfig, stages, args) -> int:
    print(_write_table(cfg, args.out))
    return 0


#: ``python -m setpo_lab run math_responses --model-path DIR --out results/math --set n=20``
COMMAND = StudyCommand("math_responses", {"default": _ResponsesConfig}, ("evaluate",), _run, default_preset="default",
                       folder=None, default_out={"default": "results/math"},
                       fields=frozenset(f.name for f in fields(_ResponsesConfig)) - {"model_path"},
                       options=("model_path",),
                       doc=__doc__)

if __name__ == "__main__":  # the recorded form `... math_responses --model-path DIR --n 20 --max-new-tokens 256 ...`
    sys.exit(run_command(COMMAND, flags_as_set(sys.argv[1:], ("--n", "--max-new-tokens", "--seed"))))
