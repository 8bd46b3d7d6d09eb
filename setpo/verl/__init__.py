"""SetPO as a verl plug-in: the ``"setpo"`` advantage estimator, the embedding step, presets and a launcher.

One module a job: ``estimator`` (registered on import), ``trainer`` (the v1 trainer hook), ``launch``
(overrides, config validation, the command line). Importing ``setpo.verl`` registers the estimator.

    Â_i = Ā_i + λ · s_i        (SetPO, arXiv 2602.01062; the math is ``setpo.setpo_advantages``)

verl (0.9) picks an advantage estimator by name (``algorithm.adv_estimator``) from the registry in
``verl.trainer.ppo.core_algos``; importing this module registers ``"setpo"`` there with ``register_adv_est``.

How the embeddings reach the estimator
--------------------------------------
verl calls an estimator with the token-level rewards, the response mask, the group ids (``index``, the
``uid`` column) and ``config`` (the ``algorithm`` section) only. SetPO also needs one embedding per response.
Two routes bring it, both ending in the same place: a context variable that holds the embeddings (N, d),
rows aligned with the batch, for the duration of one ``compute_advantage`` call. The estimator reads it,
checks that its row count and uids match the batch verl hands over, and raises a ValueError that says what
to do when it is missing.

1. ``setpo.verl.compute_advantage(data, ...)``, a small wrapper of verl's ``compute_advantage``: the
   embeddings travel in ``data.non_tensor_batch["setpo_embeddings"]`` (N, d) (or the response texts in
   ``data.non_tensor_batch["setpo_texts"]``, which the wrapper embeds; or, given a tokenizer, it decodes
   ``data.batch["responses"]``). It puts them in the context and calls verl's own ``compute_advantage``,
   which dispatches to the registered estimator. Use it in custom trainers and recipes built on DataProto.
2. verl's v1 trainer (the default in 0.9) assembles the DataProto inside ``PPOTrainer._compute_advantage``
   from a fixed list of TransferQueue fields, so nothing we add to a batch survives to the estimator. The
   trainer subclass made by ``setpo_trainer_class`` overrides that one method: it fetches the responses and
   uids of the step's keys from TransferQueue (the same calls verl uses to dump rollouts), decodes them with
   the actor's tokenizer, embeds them in one batched pass, and runs verl's ``_compute_advantage`` unchanged
   inside the context. It also logs ``setpo/*`` metrics (marginal statistics and embedding time).

Where the embedding runs, and why
---------------------------------
In the trainer process (verl's ``TaskRunner`` Ray actor), where the advantage is computed: the texts are
already there, the (N, d) result is needed only there, and nothing has to cross Ray's object store. Ray
leaves ``CUDA_VISIBLE_DEVICES`` alone for actors that ask for no GPU (unless
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``), so the task runner sees its node's GPUs; with
``embedding_device: auto`` the embedder goes to ``cuda`` when one is visible and to the CPU otherwise. One
forward pass per step over the step's batch × G responses (384 at the paper's settings) is small next to
generation; Qwen3-Embedding-0.6B takes about 2.5 GB (float32 weights and activations) next to the colocated
actor and vLLM, which is why the launcher's default ``gpu_memory_utilization`` (0.6) leaves headroom. Set
``embedding_device: cpu`` to keep the GPU memory for vLLM at the price of a slower step.

Loading the plug-in in every Ray process
----------------------------------------
verl imports every module named in the environment variable ``VERL_USE_EXTERNAL_MODULES`` at the end of
``import verl`` (``verl/__init__.py``). The launcher puts ``VERL_USE_EXTERNAL_MODULES=setpo.verl`` into the
Ray job's ``runtime_env.env_vars`` (``ray_kwargs.ray_init.runtime_env``, which verl passes to
``ray.init``), so every worker of the job (task runner, FSDP actor/ref, vLLM servers, reward workers), on
every node, registers ``"setpo"`` as it imports verl. ``setpo`` itself must be installed in the Python
environment on every node (verl sets ``working_dir=None``, so Ray ships no code). The trainer subclass is
chosen in the task runner process: verl picks the trainer class by the name in ``trainer.v1.trainer_mode``,
and that name also selects its replay buffer (sync or async), so we keep verl's name and have verl's lookup
return our subclass of the class it would have picked. ``import setpo.verl`` installs that
(``install_trainer_hook``), so verl's own ``python -m verl.trainer.main_ppo`` trains SetPO when
``VERL_USE_EXTERNAL_MODULES=setpo.verl`` is set for the driver and, through ``runtime_env.env_vars``, for every
worker; the launcher's ``SetPOTaskRunner`` (a subclass of verl's ``TaskRunnerV1``) selects it as well.

Presets
-------
``setpo.presets.PRESETS`` maps onto verl's actor settings (``verl_preset_overrides``): ratio level "token" ->
``policy_loss.loss_mode=vanilla``, "sequence" -> ``gspo``; ``clip_ratio_low/high``; ``loss_agg_mode``; the
learning rate; DAPO's dynamic sampling -> ``algorithm.filter_groups.enable``. λ, the base estimator and the
embedder go to ``algorithm.setpo`` (``SetPOVerlSettings``), the section verl hands to every estimator; verl
0.9 keeps ``algorithm`` a DictConfig (it never builds its ``AlgoConfig`` dataclass from it), so the extra
section is carried as is. **Design choice**: DAPO's soft overlong penalty is not switched on (the paper gives
no cache length for its 756-token responses).

Launcher
--------
``python -m setpo.verl train --model-path ... --train-file ... --val-file ...`` (what
``scripts/run_setpo.sh`` calls) converts raw GSM8K/MATH files to verl's parquet layout with the Qwen-Math
template (``setpo.envs.math``), builds the Hydra overrides (``build_overrides``, the paper's math settings),
composes them against verl's packaged ``ppo_trainer`` config, validates them with verl's own
``validate_config`` and runs verl's ``run_ppo`` with ``SetPOTaskRunner``. ``print-config`` does everything
but the run. Training needs verl's full runtime (``pip install 'verl[vllm]'``: TransferQueue, vLLM, ...) and
the v1 trainer (``trainer.use_v1=true``, verl's default); the legacy trainer is refused by ``validate``.

On the CPU
----------
``train --device cpu`` runs the same verl trainer without a GPU through ``setpo.verl.cpu`` (imported only by
such runs): a ``cpu`` platform, FSDP2 over gloo with logical Ray GPUs, and a transformers rollout replica that
samples from the weights verl syncs to it after every update. ``python -m setpo.verl cpu-demo`` writes a tiny
Countdown model and data and prints the command (tests/test_verl_e2e.py runs it). verl 0.9.1's model build
needed TRL's value-head model, gone in TRL 1.13: ``setpo.verl_plugin``, verl's ``verl.plugins`` entry point,
guards it in every verl process of a setpo install.
"""

# the TRL guard (setpo.verl_plugin, also verl's "verl.plugins" entry point): loaded here too, for processes that
# run with VERL_USE_EXTERNAL_PLUGINS=none but import this module through VERL_USE_EXTERNAL_MODULES
import setpo.verl_plugin  # noqa: F401,I001

# importing the estimator module registers "setpo" with verl
from setpo.verl.estimator import (
    EMBEDDINGS_KEY,
    ESTIMATOR_NAME,
    PLUGIN_ENV,
    PLUGIN_MODULE,
    TEXTS_KEY,
    SetPOVerlSettings,
    batch_embeddings,
    compute_advantage,
    compute_setpo_outcome_advantage,
    embedder_from_settings,
    embeddings_from_batch,
    resolve_device,
)
from setpo.verl.launch import launch_config_from_args, main, prepare_data
from setpo.verl.overrides import (
    VerlLaunchConfig,
    build_overrides,
    compose_config,
    validate,
    verl_config_dir,
    verl_preset_overrides,
)
from setpo.verl.trainer import (
    SetPOTrainerMixin,
    install_trainer_hook,
    setpo_task_runner,
    setpo_trainer_class,
    setpo_trainers_selected,
)

# verl's own `python -m verl.trainer.main_ppo`, given VERL_USE_EXTERNAL_MODULES=setpo.verl, trains SetPO too
install_trainer_hook()

__all__ = [
    "EMBEDDINGS_KEY",
    "ESTIMATOR_NAME",
    "PLUGIN_ENV",
    "PLUGIN_MODULE",
    "SetPOTrainerMixin",
    "SetPOVerlSettings",
    "TEXTS_KEY",
    "VerlLaunchConfig",
    "batch_embeddings",
    "build_overrides",
    "compose_config",
    "compute_advantage",
    "compute_setpo_outcome_advantage",
    "embedder_from_settings",
    "embeddings_from_batch",
    "install_trainer_hook",
    "launch_config_from_args",
    "main",
    "prepare_data",
    "resolve_device",
    "setpo_task_runner",
    "setpo_trainer_class",
    "setpo_trainers_selected",
    "validate",
    "verl_config_dir",
    "verl_preset_overrides",
]
