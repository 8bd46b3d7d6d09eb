"""verl's own trainer on a machine without a GPU: the CPU platform, FSDP2 over gloo, and a rollout replica that
generates with the current policy through transformers ``generate``. Used only when asked for
(``python -m setpo.verl train --device cpu``, or ``VERL_USE_EXTERNAL_MODULES=setpo.verl,setpo.verl.cpu`` with
``VERL_PLATFORM=cpu``); importing it changes nothing for a GPU run that does not select it.

What verl 0.9.1 needs on the CPU, and which extension point each piece uses
--------------------------------------------------------------------------
- **Platform** (public: ``verl.plugin.platform.PlatformRegistry.register``): ``PlatformCPU`` is registered as
  ``"cpu"``; ``VERL_PLATFORM=cpu`` selects it in every process (otherwise verl falls back to CUDA). Its Ray
  resource is ``"GPU"``: Ray is started with logical GPUs (``ray_init.num_gpus``), one per FSDP worker, so verl's
  resource pools, which count only accelerators, place the workers. The device module is ``torch.cpu`` with the
  memory/seed calls verl makes on ``torch.cuda`` answered for the host.
- **FSDP engine** (public: ``EngineRegistry.register``): verl's own ``FSDPEngineWithLMHead`` registered for
  device ``"cpu"`` (verl lists only cuda and npu).
- **Rollout** (public: ``RolloutReplicaRegistry.register``): ``HFRolloutReplica`` (name ``"hf"``), one Ray actor
  per replica (``HFGenerationServer``) that holds a transformers copy of the policy and answers verl's
  token-in/token-out ``generate`` with sampled token ids and their log-probabilities. In each FSDP worker,
  ``HFServerAdapter`` (verl's ``BaseRollout``) receives the trainer's full weights from verl's weight sync
  (``ActorRolloutRefWorker.update_weights``, the ``naive`` checkpoint engine the v1 trainer uses:
  ``get_per_tensor_param`` -> ``rollout.update_weights``) and ships them to its server, so every rollout
  samples from the current policy.

Private names of verl patched (all in ``_patch_verl_privates``, verl 0.9.1 only; any other version is refused)
-------------------------------------------------------------------------------------------------------------
- ``verl.workers.rollout.base._ROLLOUT_REGISTRY``: the only way to name a worker-side rollout adapter
  (``get_rollout_class`` has no public registration).
- ``verl.workers.engine_workers.initialize_global_process_group_ray``: verl builds the backend string
  ``"cpu:gloo,{device}:{backend}"``, i.e. ``"cpu:gloo,cpu:gloo"`` here, which torch rejects (a device type
  twice); on the CPU the process group is plain ``"gloo"``.
- ``verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy``: the reference model is always built with
  ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator, so on the CPU the same policy is used
  with ``pin_memory=False``.

Settings a CPU run also needs (``cpu_overrides``): ``attn_implementation`` sdpa, no remove-padding (no flash
attention), no torch compile, float32 parameters (no bf16 mixed precision), ``strategy=fsdp2``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import ray
import torch
import verl

from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

#: the verl release whose private names this module patches (see the module docstring).
TESTED_VERL = "0.9.1"
#: the name of the rollout (``actor_rollout_ref.rollout.name``) served by transformers on the CPU.
ROLLOUT_NAME = "hf"
PLATFORM_NAME = "cpu"


def check_verl_version(version: str | None = None) -> None:
    version = verl.__version__ if version is None else version
    if version.split("+")[0] != TESTED_VERL:
        raise RuntimeError(f"setpo.verl.cpu patches verl internals tested with verl {TESTED_VERL} only; found verl "
                           f"{version} (pip install verl=={TESTED_VERL})")


check_verl_version()


# --------------------------------------------------------------------------------------------------- platform


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory, what ``mem_get_info`` answers on an accelerator."""
    try:
        pages, free = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        return free * size, pages * size
    except (ValueError, OSError):
        return 0, 0


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


class _CPUDeviceModule(SimpleNamespace):
    """``torch.cpu`` plus the calls verl makes on ``torch.cuda`` (memory statistics, seeds, cache), answered for
    the host: no cache to empty, no device memory to count (0), seeds go to torch's CPU generator."""

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)


CPU_DEVICE = _CPUDeviceModule(
    is_available=lambda: True, device_count=lambda: 1, current_device=lambda: "cpu", set_device=_nothing,
    synchronize=_nothing, empty_cache=_nothing, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
    memory_allocated=_zero, memory_reserved=_zero, max_memory_allocated=_zero, max_memory_reserved=_zero,
    reset_peak_memory_stats=_nothing, reset_max_memory_allocated=_nothing, mem_get_info=_host_memory,
    get_device_name=lambda *a, **k: "cpu", ipc_collect=_nothing, memory_stats=lambda *a, **k: {},
    get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface for the host CPU: gloo collectives, logical Ray GPUs as the worker resource."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # never auto-detected: a CPU run is asked for with VERL_PLATFORM=cpu
        return False

    def current_device(self):
        # a torch device, not an index: verl writes tensor.to(get_device_id()) and torch.device(get_device_id())
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str):
        return nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical GPUs (ray.init(num_gpus=N)), one per FSDP worker

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


# --------------------------------------------------------------------------------------------------- FSDP engine


def _register_fsdp_engine() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    registry = EngineRegistry._engines["language_model"]
    for backend in ("fsdp", "fsdp2"):
        if registry.get(backend, {}).get(PLATFORM_NAME) is None:
            EngineRegistry.register(model_type="language_model", backend=backend, device=PLATFORM_NAME)(
                FSDPEngineWithLMHead)


# --------------------------------------------------------------------------------------------------- rollout


def _sampling_kwargs(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """transformers ``generate`` arguments for verl's (vLLM-style) sampling parameters."""
    temperature = float(sampling_params.get("temperature", 1.0))
    if temperature <= 0:
        return {"do_sample": False}
    out = {"do_sample": True, "temperature": temperature, "top_p": float(sampling_params.get("top_p", 1.0))}
    top_k = int(sampling_params.get("top_k", -1) or -1)
    out["top_k"] = top_k if top_k > 0 else None
    penalty = float(sampling_params.get("repetition_penalty", 1.0))
    if penalty != 1.0:
        out["repetition_penalty"] = penalty
    return out


class HFGenerationServer:
    """One rollout replica's server (a Ray actor): the policy as a transformers model, token-in/token-out.

    ``generate`` samples with transformers ``generate`` and returns verl's ``TokenOutput``: the response token
    ids and, for each, its log-probability under the distribution it was sampled from (``logprobs_mode``
    ``processed_logprobs``, verl's default) or the model's raw one (``raw_logprobs``), as vLLM reports them. ``update_weights`` loads the trainer's weights (every key must be one of the model's).
    Requests run one at a time in a worker thread (the actor's event loop stays free for control calls).
    """

    def __init__(self, config, model_config, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        torch.set_num_threads(int(os.environ.get("SETPO_ROLLOUT_THREADS", "1")))
        config = omega_conf_to_dataclass(config)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.config, self.model_config, self.replica_rank = config, model_config, replica_rank
        path = model_config.local_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_config.local_tokenizer_path or path,
                                                       trust_remote_code=model_config.trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa",
                                                          trust_remote_code=model_config.trust_remote_code)
        self.model.eval()
        self.generator = torch.Generator().manual_seed(int(getattr(config, "seed", 0) or 0) * 1000 + replica_rank)
        self.global_steps = None
        self.weight_version = 0
        self._lock = threading.Lock()
        eos = model_config.hf_config.eos_token_id if model_config.hf_config is not None else None
        self.eos_token_id = eos if eos is not None else self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_id

    # ---- weights
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"weights for parameters the rollout model does not have: {unknown[:5]}")
        missing = sorted(k for k in set(own) - set(state) if not _tied_copy(self.model, k))
        if missing:
            raise ValueError(f"the weight sync left rollout parameters unset: {missing[:5]}")
        with self._lock, torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return self.weight_version

    def weights_checksum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    # ---- generation
    def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> tuple[list[int], list[float]]:
        params = dict(sampling_params)
        max_model_len = self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        room = max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within {max_model_len}")
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            max_tokens = min(self.config.response_length,
                             self.config.prompt_length + self.config.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), room))
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        raw = self.config.logprobs_mode in ("raw_logprobs", "raw_logits")
        with self._lock, torch.no_grad():
            # transformers samples with torch's global generator: seed it from this server's own stream
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self.generator)))
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, return_dict_in_generate=True,
                output_logits=raw, output_scores=not raw, **_sampling_kwargs(params))
        tokens = out.sequences[0, ids.shape[1]:]
        # verl's default logprobs_mode "processed_logprobs" (vLLM's name): the distribution the token was drawn
        # from (temperature, top-k, top-p applied); "raw_logprobs": the model's own
        steps = out.logits if raw else out.scores
        logits = torch.stack(steps, dim=1)[0, : tokens.shape[0]].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        tokens, logprobs = tokens.tolist(), logprobs.tolist()
        if self.eos_token_id in tokens:  # generate pads after EOS when batched; keep through the first EOS
            cut = tokens.index(self.eos_token_id) + 1
            tokens, logprobs = tokens[:cut], logprobs[:cut]
        return tokens, logprobs

    async def generate(self, prompt_ids, sampling_params: dict[str, Any], request_id: str, image_data=None,
                       video_data=None, audio_data=None, mm_processor_kwargs=None, priority: int = 0, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data:
            raise ValueError("the hf CPU rollout serves text only")
        tokens, logprobs = await asyncio.to_thread(self._generate, list(prompt_ids), sampling_params)
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps, "weight_version": self.weight_version})

    # ---- the control calls verl makes on a replica's servers (nothing to free or pause on the CPU)
    async def wake_up(self, tags=None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self):
        return None

    async def wait_for_requests_to_drain(self):
        return None

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


def _tied_copy(model, name: str) -> bool:
    """Whether parameter ``name`` is the output head tied to the input embeddings (not sent separately)."""
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


def server_name(replica_rank: int) -> str:
    return f"setpo_hf_server_{replica_rank}"


def _rollout_replica_class():
    from verl.workers.rollout.replica import RolloutReplica

    class HFRolloutReplica(RolloutReplica):
        """verl's rollout replica for the CPU: one ``HFGenerationServer`` actor per replica, on the node of the
        replica's first worker (hybrid mode: the FSDP workers hold the trainer, the server the rollout copy)."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self):
            if self.world_size != 1:
                raise ValueError(f"the hf CPU rollout runs one process per replica; set rollout "
                                 f"tensor/data/pipeline parallel sizes to 1 (world size {self.world_size})")
            if self.workers:
                node_id = await self.workers[0].__ray_call__.remote(lambda w: ray.get_runtime_context().get_node_id())
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            else:
                strategy = None
            server = ray.remote(HFGenerationServer).options(
                name=server_name(self.replica_rank), num_cpus=0, num_gpus=0, scheduling_strategy=strategy,
                max_concurrency=self.max_concurrency,
            ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            self.servers = [server]
            self._server_handle = server
            self._server_address = server_name(self.replica_rank)

    HFRolloutReplica.__module__ = __name__
    return HFRolloutReplica


def _server_adapter_base():
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFServerAdapter(_server_adapter_base()):
    """The rollout side of an FSDP worker (verl's ``BaseRollout``): forwards the trainer's weights to the
    replica's ``HFGenerationServer``. Every rank walks verl's weight generator (FSDP gathers each full tensor
    collectively); the replica's first rank sends the gathered state dict to its server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % size
        self.server_handle = None
        self.sleep_level = 2

    def _server(self):
        if self.rollout_rank != 0:
            return None
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors",
                             **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"the hf CPU rollout takes full tensors (wire_format='named_tensors'), got {wire_format!r}")
        server = self._server()
        state = {}
        for name, tensor in weights:
            if server is not None:
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                state[name] = full.detach().to("cpu", copy=True)
        if server is not None:
            await server.update_weights.remote(state, global_steps)


HFServerAdapter.__module__ = __name__


# --------------------------------------------------------------------------------------------------- verl privates


def _gloo_process_group(timeout_second=None, backend=None):
    from verl.utils.distributed import initialize_global_process_group_ray

    return initialize_global_process_group_ray(timeout_second=timeout_second, backend=backend or "gloo")


def _host_offload_policy():
    from torch.distributed.fsdp import CPUOffloadPolicy

    class HostCPUOffloadPolicy(CPUOffloadPolicy):
        """verl's reference-model ``CPUOffloadPolicy(pin_memory=True)`` without pinning (no accelerator)."""

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    return HostCPUOffloadPolicy


def _patch_verl_privates() -> None:
    """The one place where verl's private names are changed (verl 0.9.1; see the module docstring)."""
    check_verl_version()
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
    import verl.workers.engine_workers as engine_workers
    import verl.workers.rollout.base as rollout_base

    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"
    engine_workers.initialize_global_process_group_ray = _gloo_process_group
    if not getattr(fsdp_impl.CPUOffloadPolicy, "setpo_host", False):
        policy = _host_offload_policy()
        policy.setpo_host = True
        fsdp_impl.CPUOffloadPolicy = policy


_INSTALLED = False


def install() -> None:
    """Register the CPU platform's pieces with verl (idempotent); runs on import in every process of a CPU run."""
    global _INSTALLED
    if _INSTALLED:
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    _register_fsdp_engine()
    replica = _rollout_replica_class()
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: replica)
    _patch_verl_privates()
    _INSTALLED = True


def selected() -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


if selected():
    install()
