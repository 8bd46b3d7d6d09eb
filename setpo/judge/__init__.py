"""The paper's LLM-judged diversity score: a judge model rates how many genuinely different approaches the
responses sampled for one problem take (1-10), and the scores are averaged per method with a 95% interval.

- ``rubric``: the versioned prompt (``PROMPT_VERSION``, ``build_messages``), the reply parser (``parse_reply``:
  a score or a missing one with its reason, never a guess) and the per-method summary;
- ``client``: ``OpenAIJudge``, any OpenAI-compatible server (``vllm serve``, ``transformers serve``), with
  bounded concurrency, retries and per-call timeouts; the API key never reaches a record, log or error;
- ``cache``: the JSONL cache that makes an interrupted evaluation resume without paying twice;
- ``run``: ``judge_sets`` (what a study calls), ``judge_items``, ``summarize``, ``load_items``;
- ``backends`` (engine adapter, not imported here): ``TransformersJudge`` (a local chat model in-process) and
  ``open_judge`` (either backend from url/model or path);
- ``python -m setpo.judge FILE --url URL --model NAME`` judges a finished run's responses.

Importing this package loads neither ``openai`` nor ``transformers``.
"""

from setpo.judge.cache import JudgeCache, cache_key
from setpo.judge.client import Judge, JudgeError, JudgeRejected, JudgeUnavailable, OpenAIJudge
from setpo.judge.rubric import MAX_RESPONSE_CHARS, PROMPT_VERSION, SCALE, Verdict, build_messages, parse_reply, \
    summarize_verdicts
from setpo.judge.run import Item, as_items, judge_items, judge_sets, load_items, summarize

__all__ = ["MAX_RESPONSE_CHARS", "PROMPT_VERSION", "SCALE", "Item", "Judge", "JudgeCache", "JudgeError",
           "JudgeRejected", "JudgeUnavailable", "OpenAIJudge", "Verdict", "as_items", "build_messages", "cache_key",
           "judge_items", "judge_sets", "load_items", "parse_reply", "summarize", "summarize_verdicts"]
