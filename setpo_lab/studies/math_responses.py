"""Real responses of a real model, scored: the check of ``setpo.envs.math``'s answer extraction and ``math_reward`` on
what a model actually writes, as a committed table.

``python -m setpo_lab.studies.math_responses --model-path DIR`` samples one response to each of the first ``n``
GSM8K test problems (``data/gsm8k/test.parquet``) with the Qwen-Math prompt through the model's chat template,
at the evaluation's sampling settings (``PAPER_RUN``: T = 0.5, top-p 0.9) and ``max_new_tokens`` tokens, and
writes ``OUT/real_responses.json`` (the config and the responses) and ``OUT/real_responses.md`` (reference,
extracted answer, reward, an excerpt of each response's end). Sampling is the slow part (2 cores: about a
minute per 20 responses of 256 tokens), so the responses are kept: a rerun with the same settings only scores
them again with the current checker (``--resample`` samples anew), which is how a fix to the extraction shows
up in the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from setpo.envs.math import final_answer, load_math_problems, math_reward
from setpo.presets import PAPER_RUN
from setpo_lab import ROOT
from setpo.records import markdown_table, read_json, write_json, write_text

PROG = "python -m setpo_lab.studies.math_responses"
GSM8K_TEST = ROOT / "data" / "gsm8k" / "test.parquet"
#: characters of each response's end shown in the table (the answer sits at the end)
EXCERPT_CHARS = 160


def sample_settings(model_path: str | Path, n: int, max_new_tokens: int, seed: int) -> dict:
    """What the sampled responses depend on (a rerun with other settings samples again)."""
    record = Path(model_path) / "setpo_model.json"
    remedy = "give an intact model folder (`python -m setpo.models prepare` makes one)"
    model = read_json(record, remedy, Path(model_path).parent).get("sha256") if record.is_file() else str(model_path)
    return {"model": model, "data": "data/gsm8k/test.parquet", "n": n, "max_new_tokens": max_new_tokens,
            "seed": seed, "temperature": PAPER_RUN.eval_temperature, "top_p": PAPER_RUN.eval_top_p}


def sample(model_path: str | Path, settings: dict, log=print) -> list[str]:
    """One response per problem (the first ``settings['n']`` GSM8K test problems)."""
    import torch

    from setpo_lab.studies.math import load_model, load_tokenizer, sample_responses

    problems = load_math_problems(GSM8K_TEST, limit=settings["n"])
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, torch.float32)
    t0 = time.perf_counter()
    texts = sample_responses(model, tokenizer, [p.question for p in problems], 1, settings["temperature"],
                             settings["top_p"], settings["max_new_tokens"], seed=settings["seed"],
                             batch_sequences=settings["n"])
    log(f"sampled {len(texts)} responses in {time.perf_counter() - t0:.0f} s")
    return [t[0] for t in texts]


def _cell(text: str) -> str:
    """Text for one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def score_table(responses: list[str], n: int) -> tuple[list[dict], str]:
    """Rows (reference, extracted answer, reward, excerpt) and the markdown table, from the current checker."""
    problems = load_math_problems(GSM8K_TEST, limit=n)
    rows = []
    for i, (p, text) in enumerate(zip(problems, responses, strict=True)):
        extracted = final_answer(text)
        rows.append({"#": i, "reference": p.answer, "extracted": "—" if extracted is None else _cell(extracted),
                     "reward": math_reward(text, p.answer), "tokens~": len(text.split()),
                     "response (last characters)": _cell(("…" if len(text) > EXCERPT_CHARS else "")
                                                         + text[-EXCERPT_CHARS:])})
    return rows, markdown_table(rows, fmt=lambda v: f"{v:g}" if isinstance(v, float) else str(v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, help="a model folder (python -m setpo.models prepare ...)")
    ap.add_argument("--out", default="results/math", help="folder for real_responses.{json,md} (default: %(default)s)")
    ap.add_argument("--n", type=int, default=20, help="problems, one response each (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resample", action="store_true", help="sample again even when the responses are kept")
    a = ap.parse_args(argv)
    if not Path(a.model_path).is_dir():
        print(f"{PROG}: error: no model folder at {a.model_path!r}; make one with `python -m setpo.models prepare "
              f"smollm2-135m-instruct DIR`", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = sample_settings(a.model_path, a.n, a.max_new_tokens, a.seed)
    kept = read_json(out / "real_responses.json") if (out / "real_responses.json").is_file() else None
    if kept is not None and kept.get("settings") == settings and not a.resample:
        responses, seconds = kept["responses"], kept["sample_seconds"]
    else:
        t0 = time.perf_counter()
        responses = sample(a.model_path, settings)
        seconds = round(time.perf_counter() - t0, 1)
        write_json(out / "real_responses.json", {"settings": settings, "sample_seconds": seconds,
                                                 "responses": responses})
    rows, table = score_table(responses, a.n)
    right = sum(r["reward"] for r in rows)
    found = sum(r["extracted"] != "—" for r in rows)
    text = (f"# Real responses on GSM8K test, scored by `setpo.envs.math`\n\n"
            f"Made by `{PROG} --model-path <folder of smollm2-135m-instruct> --n {a.n} --max-new-tokens "
            f"{a.max_new_tokens} --seed {a.seed}` (model file SHA-256 `{settings['model']}`): one response to "
            f"each of the first {a.n} GSM8K test problems, Qwen-Math prompt through the model's chat template, "
            f"T = {settings['temperature']}, top-p {settings['top_p']}, at most {a.max_new_tokens} new tokens "
            f"(sampled in {seconds:.0f} s on the CPU; responses kept in `real_responses.json`, scored again by "
            f"each run). **{right:g} of {len(rows)} right; an answer extracted from {found}.** "
            f"\"extracted\" is `setpo.envs.math.final_answer`, what `math_reward` compares with the reference; "
            f"tokens~ counts words.\n\n{table}\n")
    write_text(out / "real_responses.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
