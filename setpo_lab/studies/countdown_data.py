"""The Countdown study's text and data: the compact prompt and answer format, the splits and the warm start's
examples, scoring samples, and the embedders the validation search compares (``setpo_lab.studies.countdown``
runs the study; its docstring says what is ours to decide)."""


from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from setpo.diagnostics import diagnose_embedder
from setpo.embed import CenteredEmbedder, SolutionKeyEmbedder, load_embedder
from setpo.envs.countdown import (
    CountdownInstance,
    canonical_form,
    distinct_correct_solutions,
    extract_answer,
    make_splits,
    score_answer,
    solve,
)
from setpo.metrics import diversity_width_and_average_modes, pass_at_k
from setpo.trl.tiny_models import ANSWER_CLOSE, ANSWER_OPEN
from setpo_lab.studies.countdown_config import CEILING_EMBEDDER, CountdownLMConfig
from setpo_lab.studies.stages import Progress

# --------------------------------------------------------------------------------------------------
# Text format
# --------------------------------------------------------------------------------------------------


def prompt_text(inst: CountdownInstance) -> str:
    """The compact prompt, e.g. ``"3 7 25 50 = 82\\n"``."""
    return " ".join(str(v) for v in inst.numbers) + f" = {inst.target}\n"


def _answer_text(expression: str) -> str:
    return f"{ANSWER_OPEN}{expression}{ANSWER_CLOSE}"


def solution_key(text: str) -> str | None:
    """Canonical form of a completion's answer (the trainer counts it only when the reward says correct)."""
    answer = extract_answer(text)
    return None if answer is None else canonical_form(answer)


def _parse_prompt(prompt: str) -> tuple[tuple[int, ...], int]:
    """(numbers, target) of a compact prompt ``"3 7 25 50 = 82\\n"`` (``prompt_text``'s inverse)."""
    left, sep, right = prompt.partition("=")
    try:
        if not sep:
            raise ValueError
        return tuple(int(v) for v in left.split()), int(right.strip())
    except ValueError:
        raise ValueError(f"not a Countdown prompt of the form '3 7 25 = 82': {prompt[:60]!r}") from None


def verifier_key(prompt: str, completion: str) -> tuple[str, str]:
    """The perfect kernel's solution identity (the ceiling, ``CEILING_EMBEDDER``): a correct answer is its
    solution's canonical form (``setpo.envs.countdown.canonical_form``), anything else its whitespace-normalised text,
    so that two responses are "the same" exactly when the verifier cannot tell them apart."""
    numbers, target = _parse_prompt(prompt)
    if score_answer(completion, numbers, target) == 1.0:
        return "solution", canonical_form(extract_answer(completion))
    return "text", " ".join(completion.split())


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass
class CountdownData:
    train: list[CountdownInstance]
    val: list[CountdownInstance]
    test: list[CountdownInstance]


def make_data(cfg: CountdownLMConfig) -> CountdownData:
    """Disjoint train / validation / test problems (validation carved from the training draw)."""
    train, test = make_splits(cfg.n_train + cfg.n_val, cfg.n_test, cfg.seed, num_numbers=cfg.num_numbers,
                              number_range=cfg.number_range, target_range=cfg.target_range)
    return CountdownData(train[:cfg.n_train], train[cfg.n_train:], test)


def sft_examples(instances: Sequence[CountdownInstance], solutions_per_problem: int, seed: int,
                 log=None) -> list[dict]:
    """Prompt-completion pairs: up to ``solutions_per_problem`` distinct solver solutions per problem.

    Problems with more solutions get a seeded random subset, so the warm start sees several modes of many
    problems without over-weighting the problems that have dozens. log: a progress line at most every 10 s
    (solving the study's 3000 problems takes about 40 s on a laptop core).
    """
    if solutions_per_problem < 1:
        raise ValueError(f"solutions_per_problem must be >= 1, got {solutions_per_problem}")
    rng = random.Random(seed)
    out = []
    if log is not None:
        log(f"[data] solving {len(instances)} problems for their distinct solutions")
        instances = Progress(log, "[data] solved", len(instances)).over(instances)
    for inst in instances:
        sols = solve(inst.numbers, inst.target)
        if len(sols) > solutions_per_problem:
            sols = rng.sample(sols, solutions_per_problem)
        out.extend({"prompt": prompt_text(inst), "completion": _answer_text(s)} for s in sols)
    rng.shuffle(out)
    return out


def warm_start_texts(cfg: CountdownLMConfig, data: CountdownData | None = None, log=None) -> list[str]:
    """The warm-start completions, the reference a "centered:" embedder subtracts the mean of. data: the
    study's ``CountdownData`` when at hand (None: made again from ``cfg``, the same problems)."""
    train = (data if data is not None else make_data(cfg)).train
    return [e["completion"] for e in sft_examples(train, cfg.sft_solutions_per_problem, cfg.seed, log)]


def evaluate_samples(instances: Sequence[CountdownInstance], samples: Sequence[Sequence[str]]) -> dict:
    """pass@k (k = 1..n), accuracy and the diversity numbers from n samples per problem.

    Returns {"n", "correct" (per problem), "distinct" (per problem), "pass_at_k" (list, k = 1..n, mean over
    problems), "accuracy" (mean fraction correct = pass@1), "diversity_width", "average_modes",
    "average_modes_all" (over all problems, unsolved counting 0)}.
    """
    n = len(samples[0]) if samples else 0
    if len(samples) != len(instances) or any(len(s) != n for s in samples) or n == 0:
        raise ValueError("samples must hold the same number (>= 1) of completions for every instance")
    correct, distinct = [], []
    for inst, texts in zip(instances, samples):
        correct.append(sum(score_answer(t, inst.numbers, inst.target) == 1.0 for t in texts))
        distinct.append(len(distinct_correct_solutions(texts, inst.numbers, inst.target)))
    curve = [sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in range(1, n + 1)]
    width, modes = diversity_width_and_average_modes(distinct)
    _, modes_all = diversity_width_and_average_modes(distinct, over="all")
    return {"n": n, "correct": correct, "distinct": distinct, "pass_at_k": curve, "accuracy": curve[0],
            "diversity_width": width, "average_modes": modes, "average_modes_all": modes_all}


def rl_rows(instances: Sequence[CountdownInstance]) -> list[dict]:
    return [{"prompt": prompt_text(i), "numbers": list(i.numbers), "target": i.target} for i in instances]


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


def resolve_embedder(spec: str, reference_texts: Sequence[str] | Callable[[], Sequence[str]], cache: dict):
    """The embedder a run names, loaded once per study: "centered:<spec>" is ``<spec>`` minus its mean over
    ``reference_texts`` (the warm-start completions), ``setpo.embed.CenteredEmbedder``; "verifier" is the
    perfect kernel (``verifier_key`` through ``setpo.embed.SolutionKeyEmbedder``); anything else goes to
    ``load_embedder``. reference_texts may be a function returning them, called only when a "centered:"
    embedder is built (the study's costs a solver pass over the training problems)."""
    if spec not in cache:
        if spec == CEILING_EMBEDDER:
            cache[spec] = SolutionKeyEmbedder(verifier_key)
            return cache[spec]
        base, centred = (spec.partition(":")[2], True) if spec.startswith("centered:") else (spec, False)
        embedder = load_embedder(base)
        if centred:
            embedder = CenteredEmbedder(embedder, reference_texts() if callable(reference_texts) else reference_texts)
        cache[spec] = embedder
    return cache[spec]


def _surface_variants(expression: str, n: int, rng: random.Random) -> list[str]:
    """n texts of one solution written differently: operands of + and * swapped at random, spacing varied.
    The same solution for ``canonical_form``; what an embedder should put close together."""
    def swap(node):
        for child in ast.iter_child_nodes(node):
            swap(child)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)) and rng.random() < 0.5:
            node.left, node.right = node.right, node.left
        return node

    out = []
    for _ in range(n):
        text = ast.unparse(swap(ast.parse(expression, mode="eval")))
        out.append(text if rng.random() < 0.5 else text.replace(" ", ""))
    return out


def diagnose_embedders(cfg: CountdownLMConfig, data: CountdownData, embedders: dict,
                       reference: Sequence[str] | Callable[[], Sequence[str]], max_problems: int = 40) -> dict:
    """``setpo.diagnostics.diagnose_embedder`` for every embedder the study uses, on validation problems with
    at least 4 distinct solutions: up to 6 solutions each, 3 surface variants per solution."""
    rng = random.Random(cfg.seed)
    problems = []
    for inst in data.val:
        sols = solve(inst.numbers, inst.target)
        if len(sols) >= 4:
            picked = rng.sample(sols, min(6, len(sols)))
            problems.append([(_answer_text(v), s) for s in picked for v in _surface_variants(s, 3, rng)])
        if len(problems) >= max_problems:
            break
    specs = dict.fromkeys((cfg.paper_embedder, *cfg.search_embedders))
    return {spec: diagnose_embedder(resolve_embedder(spec, reference, embedders), problems) for spec in specs}
