"""`python -m setpo.judge FILE --url URL --model NAME` (or `--local PATH`): the LLM-judged diversity of a finished
run's responses, per method, with 95% intervals and the missing scores counted.

FILE is JSONL (one {"problem", "method", "responses": [...]} per line) or JSON (a list of them). Verdicts are
cached in FILE's folder (``--cache``), so an interrupted run resumes without asking twice; the summary (judge,
prompt version, per-method scores, per-item verdicts) is written to ``--out``. The API key is read from the
environment variable named by ``--api-key-env`` (default OPENAI_API_KEY), never from the command line, where
shell history and the process list would show it. Arguments and FILE are checked before the judge is asked:
a bad one is one line and exit status 2; a judge that is down or too slow is one line and exit status 1, and so
is a file that cannot be written. A reply that is not a chat completion (broken or cut-off JSON, an HTML page, a
wrong shape) is a missing score, counted with its reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setpo.judge.cache import JudgeCache
from setpo.judge.client import JudgeError, check_api_key, check_url
from setpo.judge.rubric import MAX_RESPONSE_CHARS, PROMPT_VERSION, SCALE
from setpo.judge.run import judge_items, load_items, summarize
from setpo.records import markdown_table, write_json
from setpo.envs.arguments import Parser, nonnegative_float, positive_int


def build_parser() -> Parser:
    p = Parser(prog="python -m setpo.judge", description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="JSONL/JSON of {problem, method, responses} items")
    p.add_argument("--url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
    p.add_argument("--model", help="the model name the server serves (with --url)")
    p.add_argument("--local", metavar="PATH", help="a local chat model folder, run in-process instead of a server")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the server's API key (default OPENAI_API_KEY)")
    p.add_argument("--cache", help="verdict cache (JSONL; default FILE's name + .judge-cache.jsonl)")
    p.add_argument("--out", help="summary JSON (default FILE's name + .judged.json)")
    p.add_argument("--concurrency", type=positive_int, default=8, help="requests in flight (server only)")
    p.add_argument("--timeout", type=nonnegative_float, default=120.0, help="seconds per request (server only)")
    p.add_argument("--retries", type=int, default=2, choices=range(0, 11), metavar="{0..10}",
                   help="tries after a failed request (server only)")
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="longest judge reply, in tokens")
    p.add_argument("--max-chars", type=positive_int, default=MAX_RESPONSE_CHARS,
                   help="each response is cut to this many characters in the prompt")
    p.add_argument("--device", help="device for --local (cpu, cuda, ...)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    url = args.url if args.url is not None else (None if args.local else os.environ.get("OPENAI_BASE_URL"))
    if args.local and (args.url or args.model):
        p.error("give either --local PATH or --url/--model, not both")
    if not args.local:
        if not url:
            p.error("no judge: give --url URL --model NAME (an OpenAI-compatible server, e.g. `vllm serve`), set "
                    "OPENAI_BASE_URL, or give --local PATH")
        if not args.model:
            p.error("--model is required with a judge server: the model name it serves")
        try:
            args.url = check_url(url)
        except ValueError as err:
            p.error(str(err))
        if args.timeout <= 0:
            p.error("--timeout must be > 0 seconds")
        try:
            check_api_key(os.environ.get(args.api_key_env), f"${args.api_key_env}")
        except ValueError as err:
            p.error(str(err))
    elif not (Path(args.local) / "config.json").is_file():
        p.error(f"--local {args.local}: no model there (a folder with config.json)")
    try:
        args.items = load_items(args.file)
    except ValueError as err:
        p.error(str(err))
    stem = Path(args.file)
    args.cache = Path(args.cache) if args.cache else stem.with_name(stem.name + ".judge-cache.jsonl")
    args.out = Path(args.out) if args.out else stem.with_name(stem.name + ".judged.json")
    for what, path in (("--cache", args.cache), ("--out", args.out)):
        if path.is_dir():
            p.error(f"{what} {path} is a folder; give a file path")
        if not path.parent.is_dir():
            p.error(f"{what} {path}: folder {path.parent} does not exist")
    try:
        JudgeCache(args.cache)  # a damaged or foreign cache is refused before the judge is asked
    except ValueError as err:
        p.error(str(err))
    return args


def make_judge(args):
    from setpo.judge.backends import open_judge

    if args.local:
        return open_judge(path=args.local, max_tokens=args.max_tokens, device=args.device)
    return open_judge(url=args.url, model=args.model, api_key=os.environ.get(args.api_key_env),
                      timeout=args.timeout, retries=args.retries, concurrency=args.concurrency,
                      max_tokens=args.max_tokens)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        judge = make_judge(args)
    except ValueError as err:
        print(f"python -m setpo.judge: error: {err}", file=sys.stderr)
        return 2
    print(f"judging {len(args.items)} sets with {judge!r}, prompt {PROMPT_VERSION}; cache {args.cache}", flush=True)
    try:
        results = judge_items(args.items, judge, args.cache, max_chars=args.max_chars, progress=not args.no_progress)
    except (JudgeError, OSError) as err:  # OSError: the cache cannot be written (disk full, permissions)
        print(f"python -m setpo.judge: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"python -m setpo.judge: interrupted; the verdicts so far are in {args.cache}: run again to resume",
              file=sys.stderr)
        return 130
    summary = summarize(results, judge)
    try:
        write_json(args.out, {"prompt_version": PROMPT_VERSION, "scale": list(SCALE), "judge": judge.describe(),
                              "file": str(args.file), "max_chars": args.max_chars, "methods": summary,
                              "items": [{k: r[k] for k in ("method", "score", "missing")}
                                        | {"problem": r["problem"][:200]} for r in results]})
    except OSError as err:
        print(f"python -m setpo.judge: error: cannot write the summary {args.out} ({err.strerror or err}); the "
              f"verdicts are in {args.cache}: run again with another --out", file=sys.stderr)
        return 1
    rows = [{"method": m, f"judged diversity ({SCALE[0]}-{SCALE[1]})": s["mean"],
             "95% interval": "-" if s["lo"] is None else f"[{s['lo']:.2f}, {s['hi']:.2f}]",
             "scored": s["scored"], "missing": s["missing"],
             "why missing": ", ".join(f"{k}: {v}" for k, v in s["missing_reasons"].items()) or "-"}
            for m, s in summary.items()]
    print(markdown_table(rows, fmt=_fmt))
    print(f"prompt {PROMPT_VERSION}, judge {judge.name}; summary in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
