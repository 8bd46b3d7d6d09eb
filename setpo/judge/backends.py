"""The judge backends a caller picks from: ``open_judge(url=..., model=...)`` (an OpenAI-compatible server) or
``open_judge(path=...)`` (a chat model run in-process by transformers, ``TransformersJudge``).

This module is an engine adapter (it uses transformers, imported inside its functions); the rest of
``setpo.judge`` is the core and never imports it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from setpo.judge.client import JudgeRejected, JudgeUnavailable, OpenAIJudge, check_positive
from setpo.refusals import file_refusal, loading


class TransformersJudge:
    """A chat model from a local folder (a ``save_pretrained`` or ``hf download`` copy with a chat template),
    loaded on the first request and run greedily, one request at a time, on ``device`` ("cpu", "cuda", ...;
    default: transformers' choice). Never downloads: a folder without config.json is a ValueError."""

    concurrency = 1

    def __init__(self, path: str | Path, *, max_new_tokens: int = 1024, device: str | None = None,
                 dtype: str = "auto"):
        self.path = Path(path).expanduser().resolve()
        if not (self.path / "config.json").is_file():
            raise ValueError(f"no model at {self.path} (a folder with config.json); download the judge model "
                             "first, e.g. `hf download Qwen/Qwen2.5-7B-Instruct --local-dir PATH`")
        self.max_new_tokens = check_positive("max_new_tokens", max_new_tokens, int)
        self.device, self.dtype = device, dtype
        self.name = f"transformers:{self.path}|greedy|max_new_tokens={self.max_new_tokens}"
        self._model = self._tokenizer = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TransformersJudge({str(self.path)!r})"

    def describe(self) -> dict:
        return {"backend": "transformers", "path": str(self.path), "max_new_tokens": self.max_new_tokens,
                "device": self.device, "name": self.name}

    def _load(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # the folder's files are external input (damaged, foreign): a failed load is refused with the folder and
        # what to do first, and a cause in our words, never the library's text (setpo.refusals)
        remedy = "give the folder of a complete chat model (config, weights, tokenizer) as the local judge"
        with loading(self.path, remedy, expected="model folder", root=self.path.parent):
            tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        if not getattr(tok, "chat_template", None):
            raise file_refusal(self.path, "has no chat template", "give an instruct/chat model as the judge",
                               root=self.path.parent)
        kw = {"device_map": self.device} if self.device else {}
        with loading(self.path, remedy, expected="model folder", root=self.path.parent):
            model = AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True, dtype=self.dtype, **kw)
        model.eval()
        return tok, model

    def reply(self, messages: list[dict]) -> str | None:
        import torch

        with self._lock:
            if self._model is None:
                try:
                    self._tokenizer, self._model = self._load()
                except ValueError as err:  # the refusals of _load: the folder, what to do, a short cause
                    raise JudgeUnavailable(f"the judge model {err}") from None
            tok, model = self._tokenizer, self._model
            inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True).to(model.device)
            limit = getattr(model.config, "max_position_embeddings", None)
            n = inputs["input_ids"].shape[1]
            if limit and n + self.max_new_tokens > limit:
                raise JudgeRejected(f"prompt of {n} tokens + {self.max_new_tokens} new ones exceeds the judge's "
                                    f"context of {limit}")
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
            return tok.decode(out[0, n:], skip_special_tokens=True)


def open_judge(*, url: str | None = None, model: str | None = None, path: str | Path | None = None,
               api_key: str | None = None, **options):
    """A judge: ``path`` (a local chat model, in-process) or ``url``/``model`` (an OpenAI-compatible server;
    ``url`` defaults to ``$OPENAI_BASE_URL``, the key to ``$OPENAI_API_KEY``). ``options`` go to the judge:
    timeout, retries, concurrency, max_tokens (OpenAIJudge); max_tokens, device (TransformersJudge)."""
    if path is not None:
        if url is not None or model is not None:
            raise ValueError("give either a local judge model path or a judge server (url and model), not both")
        allowed = {"max_tokens", "device"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"options {unknown} do not apply to a local judge model (only {sorted(allowed)})")
        kw = {"device": options.get("device")}
        if "max_tokens" in options:
            kw["max_new_tokens"] = options["max_tokens"]
        return TransformersJudge(path, **kw)
    return OpenAIJudge(model=model, base_url=url, api_key=api_key, **options)
