"""verl's v1 trainer with SetPO: a ``PPOTrainer`` subclass that embeds the step's responses before verl's
own advantage step, and the task runner that selects it (see ``setpo.verl``)."""


from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator

from setpo.reads import ExploitMonitor, kernel_texts
from setpo.verl.estimator import (
    ESTIMATOR_NAME,
    SetPOVerlSettings,
    batch_embeddings,
    embedder_from_settings,
    session_layout,
)


#: the environment variable naming the file where the trainer records its progress (the launcher sets it in the
#: Ray job's runtime_env; its heartbeat reads the file), and that file's name in the run folder.
PROGRESS_ENV = "SETPO_VERL_PROGRESS"
PROGRESS_FILE = "progress.json"
#: a folder: when set, the trainer writes each step's responses and advantages there (``_setpo_audit``)
AUDIT_ENV = "SETPO_VERL_AUDIT"


class SetPOTrainerMixin:
    """Mixed into a verl v1 ``PPOTrainer`` subclass: embeds the step's responses before verl's advantage step.

    Only ``_compute_advantage`` changes: with ``algorithm.adv_estimator == "setpo"`` it fetches ``uid`` and
    ``responses`` for the batch's keys from TransferQueue, decodes the responses with the actor's tokenizer
    (prompt excluded, special tokens dropped), embeds them in batches, and calls verl's own
    ``_compute_advantage`` inside ``batch_embeddings``; verl's DataProto is built from the same keys in the
    same order, which the estimator verifies by uid. The keys (``{uid}_{session_id}_{index}``) also go to
    the estimator, which, like verl's GRPO, lets only each session's final output enter the group
    statistics; each session is embedded once, as the texts of all its outputs joined in index order (its
    complete trajectory). At λ = 0 nothing is embedded.
    """

    def _setpo_progress(self, phase: str) -> None:
        path = os.environ.get(PROGRESS_ENV)
        if not path:
            return
        record = {"step": int(getattr(self, "global_steps", 0)), "total": getattr(self, "total_training_steps", None),
                  "phase": phase, "time": time.time()}
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except OSError:  # progress is a courtesy: a read-only or vanished folder must not stop training
            pass

    def on_train_begin(self):
        self._setpo_progress("train")
        return super().on_train_begin()

    def on_step_begin(self):
        self._setpo_progress("step")
        return super().on_step_begin()

    def on_validate_begin(self):
        self._setpo_progress("validate")
        return super().on_validate_begin()

    def _setpo_fetch(self, batch) -> tuple[list[str], list]:
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "responses"])
        responses = data["responses"].to_padded_tensor(padding=self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        uids = data["uid"]  # a NonTensorStack (tolist) or, from TensorDict indexing, a plain list of strings
        return texts, list(uids.tolist() if hasattr(uids, "tolist") else uids)

    def _compute_advantage(self, batch, metrics: dict):
        if self.config.algorithm.adv_estimator != ESTIMATOR_NAME:
            out = super()._compute_advantage(batch, metrics)
            self._setpo_audit(out)
            return out
        settings = SetPOVerlSettings.from_algorithm_config(self.config.algorithm)
        keys = [str(k) for k in batch.keys]
        emb = uids = readable = answers = texts = None
        if settings.lam != 0:
            t0 = time.perf_counter()
            texts, uids = self._setpo_fetch(batch)
            texts = session_texts(keys, texts)
            read, readable, answers = kernel_texts(texts, settings.kernel_reads, settings.reader())
            emb = embedder_from_settings(settings)(read)
            metrics["setpo/embed_time_s"] = time.perf_counter() - t0
        with batch_embeddings(emb, uids=uids, session_keys=keys, readable=readable) as record:
            out = super()._compute_advantage(batch, metrics)
        metrics.update(record.stats)
        if settings.lam != 0 and settings.monitor:
            if not hasattr(self, "_setpo_monitor"):
                self._setpo_monitor = ExploitMonitor(window=settings.monitor_window)
            rows = record.rows
            metrics.update(self._setpo_monitor.observe(rows["s"], rows["lengths"], rows["in_sets"], answers, texts,
                                                       lam=settings.lam, kernel_reads=settings.kernel_reads,
                                                       groups=rows["groups"]))
        self._setpo_audit(out)
        return out

    def _setpo_audit(self, batch) -> None:
        """With ``SETPO_VERL_AUDIT`` set to a folder: write the step's responses, rewards, the advantages verl
        stored, and verl's own ``"grpo"`` advantages recomputed on the same batch, as ``step_<N>.json`` (what
        tests/test_verl_e2e.py checks SetPO's advantages against). Costs one TransferQueue read per step."""
        folder = os.environ.get(AUDIT_ENV)
        if not folder:
            return
        import numpy as np
        import transfer_queue as tq
        from verl.protocol import DataProto
        from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

        fields = ["uid", "responses", "response_mask", "rm_scores", "advantages"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        mask = data["response_mask"].to_padded_tensor(padding=0)
        texts = self.tokenizer.batch_decode(data["responses"].to_padded_tensor(padding=self.tokenizer.pad_token_id),
                                            skip_special_tokens=True)
        uids = data["uid"]
        uids = list(uids.tolist() if hasattr(uids, "tolist") else uids)
        scores = data["rm_scores"].to_padded_tensor(padding=0)
        stored = data["advantages"].to_padded_tensor(padding=0)
        # verl's GRPO on the same rewards, by the same call the v1 trainer makes (_compute_advantage)
        proto = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                                    non_tensors={"uid": np.array(uids, dtype=object)})
        grpo = compute_advantage_for_multi_trajectories(
            proto, batch_keys=[str(k) for k in batch.keys], adv_estimator="grpo", gamma=self.config.algorithm.gamma,
            lam=self.config.algorithm.lam, num_repeat=self.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
            config=self.config.algorithm).batch["advantages"]
        rows = mask.sum(-1).long().tolist()
        record = {"step": int(self.global_steps), "estimator": str(self.config.algorithm.adv_estimator),
                  "keys": [str(k) for k in batch.keys], "uids": [str(u) for u in uids], "texts": texts,
                  "scores": scores.sum(-1).tolist(), "response_tokens": rows,
                  "advantages": [stored[i, :n].tolist() for i, n in enumerate(rows)],
                  "grpo_advantages": [grpo[i, :n].tolist() for i, n in enumerate(rows)]}
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"step_{int(self.global_steps)}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)


def session_texts(keys: list[str], texts: list[str]) -> list[str]:
    """Each row's session trajectory: the texts of all rows of its ``{uid}_{session_id}`` joined in index
    order (a session with one output keeps its text unchanged)."""
    if len(keys) != len(texts):
        raise ValueError(f"{len(keys)} keys for {len(texts)} texts")
    _, back = session_layout(keys)
    parts: dict[int, list[tuple[int, str]]] = {}
    for key, session, text in zip(keys, back.tolist(), texts):
        parts.setdefault(session, []).append((int(key.rsplit("_", 1)[1]), text))
    joined = {j: "\n".join(t for _, t in sorted(p, key=lambda x: x[0])) for j, p in parts.items()}
    return [joined[j] for j in back.tolist()]


_TRAINER_CLASSES: dict[type, type] = {}


def setpo_trainer_class(base: type) -> type:
    """``SetPOTrainerMixin`` + a verl v1 trainer class (cached, so each base gets one subclass; a class that
    already has the mixin is returned as it is)."""
    if issubclass(base, SetPOTrainerMixin):
        return base
    if base not in _TRAINER_CLASSES:
        _TRAINER_CLASSES[base] = type(f"SetPO{base.__name__}", (SetPOTrainerMixin, base),
                                      {"__module__": __name__, "__doc__": SetPOTrainerMixin.__doc__})
    return _TRAINER_CLASSES[base]


@contextlib.contextmanager
def setpo_trainers_selected() -> Iterator[None]:
    """While active, verl's ``get_trainer_cls(mode)`` returns the SetPO subclass of the class it names.

    verl's task runner looks the trainer class up by ``trainer.v1.trainer_mode`` at run time; the mode name
    also selects its replay buffer, so the name stays verl's and only the returned class changes.
    """
    import verl.trainer.ppo.v1 as v1

    original = v1.get_trainer_cls
    v1.get_trainer_cls = lambda name: setpo_trainer_class(original(name))
    try:
        yield
    finally:
        v1.get_trainer_cls = original


TRAINER_MODULE = "verl.trainer.ppo.v1"


def _hook_get_trainer_cls(v1) -> None:
    if getattr(v1.get_trainer_cls, "setpo_hook", False):
        return
    original = v1.get_trainer_cls

    def get_trainer_cls(name: str) -> type:
        return setpo_trainer_class(original(name))

    get_trainer_cls.setpo_hook = True
    get_trainer_cls.__doc__ = original.__doc__
    v1.get_trainer_cls = get_trainer_cls


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Finds ``TRAINER_MODULE`` with the other finders and hooks it right after it has run (once)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; and the real spec comes from the finders after this one
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _hook_get_trainer_cls(module)

        spec.loader.exec_module = exec_module
        return spec


def install_trainer_hook() -> None:
    """Make verl's ``get_trainer_cls(mode)`` return the SetPO subclass of the class it names, in this process
    (idempotent). ``import setpo.verl`` calls it, so that verl's own ``python -m verl.trainer.main_ppo`` trains
    SetPO when ``VERL_USE_EXTERNAL_MODULES=setpo.verl`` makes its task runner import the plug-in. The subclass
    changes nothing for any other estimator: ``_compute_advantage`` hands those to verl as they are.

    verl's trainer module is hooked when it is imported, not imported here: it pulls in verl's engines, which ask
    for the device platform at import, before a platform plug-in listed after ``setpo.verl`` (the CPU one) has
    registered it; and most of verl's processes never need it.
    """
    if TRAINER_MODULE in sys.modules:
        _hook_get_trainer_cls(sys.modules[TRAINER_MODULE])
    elif not any(isinstance(f, _HookOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _HookOnImport())


_TASK_RUNNER = None


def setpo_task_runner():
    """A Ray actor class: verl's ``TaskRunnerV1`` whose ``run`` uses the SetPO trainer subclass."""
    global _TASK_RUNNER
    if _TASK_RUNNER is None:
        import ray
        from verl.trainer.main_ppo import TaskRunnerV1

        class SetPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
            def run(self, config):
                with setpo_trainers_selected():
                    return super().run(config)

        _TASK_RUNNER = ray.remote(SetPOTaskRunner)
    return _TASK_RUNNER
