"""A file the package cannot load is refused with one line that leads with the file (relative to its run folder)
and what to do, then a short cause in the package's words (``setpo.refusals``), never a library's text:
torch's refusal of a damaged checkpoint is 300 characters that advise loading it again with safe loading turned
off, the one thing a user must not do with a file of unknown origin, and it reads differently for other bytes.

Each loader that takes a file from disk gets the same faults: random bytes (several seeds), an empty file, a
valid file cut in half, and a pickle that carries a payload (refused, never run). Each refusal has the file and
the remedy in its first ``HEAD`` characters, no advice to turn off safe loading, and the same text whatever the
random bytes were.
"""

import io
import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

from setpo import refusals
from setpo.records import read_json, read_records

HEAD = 120
SEEDS = (0, 1, 2, 3)
FAULTS = [f"random {s}" for s in SEEDS] + ["empty", "truncated", "payload"]
ADVICE = re.compile(r"weights.only|arbitrary code|trusted source", re.IGNORECASE)


class Payload:
    """A pickle that would create ``marker`` when unpickled: a loader must refuse it without running it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def fault_bytes(fault: str, valid: bytes, payload: bytes) -> bytes:
    if fault.startswith("random"):
        return random.Random(int(fault.split()[1])).randbytes(max(len(valid), 256))
    return {"empty": b"", "truncated": valid[: len(valid) // 2], "payload": payload}[fault]


def check_refusals(messages: dict[str, str], shown: str, remedy: str, problem: str = "cannot be loaded") -> None:
    """Every message leads with ``shown`` and ``remedy`` within ``HEAD`` characters, is one line without advice to
    turn off safe loading, and the random faults read alike."""
    head = f"{shown}: {problem}; {remedy}"
    assert len(head) <= HEAD, head
    for fault, msg in messages.items():
        assert msg.startswith(head), (fault, msg)
        assert "\n" not in msg and not ADVICE.search(msg), (fault, msg)
    randoms = {messages[f] for f in messages if f.startswith("random")}
    assert len(randoms) <= 1, randoms


def refused(load, path: Path, data: bytes, error=ValueError) -> str:
    path.write_bytes(data)
    with pytest.raises(error) as err:
        load(path)
    return str(err.value)


# ---- the shared formatter -----------------------------------------------------------------------------------

def test_a_cause_is_short_and_never_relays_advice_to_load_unsafely(tmp_path):
    advice = pickle.UnpicklingError("Weights only load failed. In PyTorch 2.6, we changed the default value of the "
                                    "`weights_only` argument in `torch.load` from `False` to `True`. Re-running ...")
    assert refusals.cause(advice) == "UnpicklingError"
    assert refusals.cause(advice, "torch checkpoint") == "not a readable torch checkpoint"
    assert refusals.cause(IndexError("pop from empty list"), "torch checkpoint") == "not a readable torch checkpoint"
    # torch's zip reader raises a plain OSError for a cut archive: the file's fault, not the system's
    assert refusals.cause(OSError(22, "Invalid argument"), "torch checkpoint") == "not a readable torch checkpoint"
    long = refusals.cause(RuntimeError("x" * 500 + "\nsecond line"))
    assert long.startswith("RuntimeError: x") and len(long) <= len("RuntimeError: ") + refusals.MAX_CLAUSE
    assert refusals.cause(PermissionError(13, "Permission denied", "/x"), "JSON file") == \
        "PermissionError: Permission denied"
    (tmp_path / "empty.pt").write_bytes(b"")
    assert refusals.cause(EOFError(), "torch checkpoint", tmp_path / "empty.pt") == "an empty file"
    msg = str(refusals.cannot_load(tmp_path / "run" / "a.pt", advice, "delete it", expected="torch checkpoint",
                                   root=tmp_path))
    assert msg == (f"run/a.pt: cannot be loaded; delete it (cause: not a readable torch checkpoint; "
                   f"at {tmp_path / 'run' / 'a.pt'})")
    assert str(refusals.file_refusal("rel/b.json", "cannot be loaded", "delete it")) == \
        "rel/b.json: cannot be loaded; delete it"  # shown as given: no full path to add


# ---- the toy's checkpoint (torch.load) ----------------------------------------------------------------------

SMALL_TOY = dict(steps=3, groups_per_step=4, snapshot_every=6, snapshot_samples=16)


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory) -> bytes:
    from setpo_lab.studies.toy import ToyConfig, train

    run = tmp_path_factory.mktemp("toy")
    train(ToyConfig(checkpoint_dir=str(run), **SMALL_TOY), progress=False)
    return (run / "checkpoint.pt").read_bytes()


def test_toy_checkpoint(toy_checkpoint, tmp_path):
    from setpo_lab.studies.toy import ToyConfig, train

    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"step": 1, "policy": Payload(marker)}, buffer)
    run = tmp_path / "a run folder whose path is long enough to push the remedy out of sight" / "toy"
    run.mkdir(parents=True)
    load = lambda p: train(ToyConfig(checkpoint_dir=str(p.parent), **SMALL_TOY), progress=False)  # noqa: E731
    messages = {f: refused(load, run / "checkpoint.pt", fault_bytes(f, toy_checkpoint, buffer.getvalue()))
                for f in FAULTS}
    check_refusals(messages, "checkpoint.pt", "delete it and rerun to start this run over")
    assert not marker.exists()
    assert messages["empty"].endswith(f"(cause: an empty file; at {run / 'checkpoint.pt'})")
    assert messages["random 0"].endswith(f"(cause: not a readable toy checkpoint; at {run / 'checkpoint.pt'})")
    assert messages["truncated"] == messages["payload"] == messages["random 0"]  # one fault, one message


# ---- JSON records and configs (setpo.records.read_json, and the claim of a run folder) -----------------

VALID_JSON = json.dumps({"lr": 0.1, "seed": 0, "steps": 3, "model": {"hidden": 8}}).encode()


def _json_payload(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker))


def test_json_record(tmp_path):
    marker = tmp_path / "pwned"
    remedy = "delete it and rerun to evaluate again"
    messages = {f: refused(lambda p: read_json(p, remedy), tmp_path / "eval.json",
                           fault_bytes(f, VALID_JSON, _json_payload(marker))) for f in FAULTS}
    check_refusals(messages, "eval.json", remedy)
    assert not marker.exists()
    assert "(cause: not a readable JSON file; at " in messages["truncated"]


def test_json_config_of_a_run_folder(tmp_path, monkeypatch):
    from setpo_lab.studies.stages import claim_folder

    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    config = json.loads(VALID_JSON)
    messages = {f: refused(lambda p: claim_folder("run", config), Path("run") / "config.json",
                           fault_bytes(f, VALID_JSON, _json_payload(tmp_path / "pwned"))) for f in FAULTS}
    check_refusals(messages, "config.json", "delete run and rerun to start over")


def test_json_records_of_a_model_folder(tmp_path):
    """``model_identity`` (which evaluations a model shares) and ``_sample_settings`` read a model folder's JSON."""
    from setpo_lab.studies import math_responses
    from setpo_lab.studies.sampling import model_identity

    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    payload = _json_payload(tmp_path / "pwned")
    messages = {f: refused(lambda p: model_identity(folder), folder / "tokenizer_config.json",
                           fault_bytes(f, VALID_JSON, payload)) for f in FAULTS}
    check_refusals(messages, "final/tokenizer_config.json",
                   "give an intact model folder (a trained one: delete its run and rerun)")
    (folder / "tokenizer_config.json").unlink()
    messages = {f: refused(lambda p: math_responses._sample_settings(folder, 1, 8, 0), folder / "setpo_model.json",
                           fault_bytes(f, VALID_JSON, payload)) for f in FAULTS}
    check_refusals(messages, "final/setpo_model.json",
                   "give an intact model folder (`python -m setpo.models prepare` makes one)")


# ---- JSON lines: records (probes, evaluations in progress) and the judge's cache -----------------------------

VALID_JSONL = b'{"step": 0, "text": "a"}\n{"step": 1, "text": "b"}\n{"step": 2, "text": "c"}\n'


def test_json_lines_records(tmp_path):
    """Not text, or a damaged line before the last, is refused. An empty file holds no records, and a last line
    cut short is what a kill mid-write leaves: both are read, by design (``read_records``)."""
    path = tmp_path / "probes.jsonl"
    remedy = "delete the file to record it again (or the run folder to start over)"
    payload = _json_payload(tmp_path / "pwned")
    messages = {f: refused(read_records, path, fault_bytes(f, VALID_JSONL, payload))
                for f in FAULTS if f not in ("empty", "truncated")}
    check_refusals(messages, "probes.jsonl", remedy)
    path.write_bytes(b"")
    assert read_records(path) == []
    path.write_bytes(VALID_JSONL[: len(VALID_JSONL) // 2])
    assert read_records(path) == [{"step": 0, "text": "a"}]
    path.write_bytes(b'{"step": 0}\n{"st\n{"step": 2}\n')
    assert refused(read_records, path, path.read_bytes()).startswith(f"probes.jsonl: line 2 cannot be loaded; {remedy}")


def test_judge_cache(tmp_path):
    """As JSON lines; a refused file is left as it was (the cut last line of a cache is dropped only once the
    file is known to be one)."""
    from setpo.judge import JudgeCache

    path = tmp_path / "judge_cache.jsonl"
    payload = _json_payload(tmp_path / "pwned")
    messages = {}
    for fault in FAULTS:
        if fault in ("empty", "truncated"):
            continue
        data = fault_bytes(fault, VALID_JSONL, payload)
        messages[fault] = refused(JudgeCache, path, data)
        assert path.read_bytes() == data
    check_refusals(messages, "judge_cache.jsonl", "give another cache file, or delete this one to judge again")
    assert not (tmp_path / "pwned").exists()
    path.write_bytes(b"")
    assert len(JudgeCache(path)) == 0


def test_judge_items_file(tmp_path):
    from setpo.judge import load_items

    valid = json.dumps([{"problem": "p", "method": "m", "responses": ["a", "b"]}]).encode()
    payload = _json_payload(tmp_path / "pwned")
    remedy = "give a JSON list of {problem, method, responses} objects, or one per line (JSONL)"
    messages = {f: refused(load_items, tmp_path / "items.json", fault_bytes(f, valid, payload))
                for f in FAULTS if f != "empty"}
    lines = {f: m for f, m in messages.items() if f != "truncated"}  # not a JSON list: read as JSON lines
    check_refusals(lines, "items.json", remedy, problem="line 1 cannot be loaded")
    check_refusals({"truncated": messages["truncated"]}, "items.json", remedy)
    assert refused(load_items, tmp_path / "items.json", b"").endswith("items.json: nothing to judge: no items")


# ---- model folders (transformers' from_pretrained: safetensors, or a pickled pytorch_model.bin) --------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from setpo.trl.tiny_models import ModelSize, make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", size=ModelSize(32, 1, 2, 1, 64, 48))


def _model_folder_refusals(tiny_model: Path, tmp_path: Path, load, error=ValueError) -> dict[str, str]:
    """``load(folder)``'s message for each fault of the folder's weights; a payload comes as pytorch_model.bin."""
    marker = tmp_path / "pwned"
    valid = (tiny_model / "model.safetensors").read_bytes()
    folder = tmp_path / "study" / "sft" / "final"
    out = {}
    for fault in FAULTS:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(tiny_model, folder)
        if fault == "payload":
            (folder / "model.safetensors").unlink()
            torch.save({"model.embed_tokens.weight": Payload(marker)}, folder / "pytorch_model.bin")
            with pytest.raises(error) as err:
                load(folder)
            out[fault] = str(err.value)
        else:
            out[fault] = refused(lambda p: load(folder), folder / "model.safetensors", fault_bytes(fault, valid, b""),
                                 error)
    assert not marker.exists()
    return out


def test_countdown_trained_model(tiny_model, tmp_path):
    from setpo_lab.studies import countdown_training

    messages = _model_folder_refusals(tiny_model, tmp_path, countdown_training._load_trained)
    check_refusals(messages, "sft/final", "delete sft and rerun to train that stage again")
    assert all(m.endswith(f"(cause: not a readable model folder; at {tmp_path / 'study' / 'sft' / 'final'})")
               for m in messages.values())


def test_math_model_and_tokenizer(tiny_model, tmp_path):
    from setpo_lab.studies.math import MODEL_REMEDY, load_model, load_tokenizer

    messages = _model_folder_refusals(tiny_model, tmp_path, lambda p: load_model(p, torch.float32))
    check_refusals(messages, "final", MODEL_REMEDY)
    folder = tmp_path / "tok" / "final"
    shutil.copytree(tiny_model, folder)
    valid = (folder / "tokenizer.json").read_bytes()
    messages = {f: refused(lambda p: load_tokenizer(folder), folder / "tokenizer.json", fault_bytes(f, valid, b""))
                for f in FAULTS}
    check_refusals(messages, "final", MODEL_REMEDY)


def test_local_judge_model(tiny_model, tmp_path):
    from setpo.judge.backends import TransformersJudge
    from setpo.judge.client import JudgeUnavailable

    def load(folder):
        TransformersJudge(folder).reply([{"role": "user", "content": "hi"}])

    messages = _model_folder_refusals(tiny_model, tmp_path, load, JudgeUnavailable)
    prefix = "the judge model "
    assert all(m.startswith(prefix) for m in messages.values())
    check_refusals({f: m[len(prefix):] for f, m in messages.items()}, "final",
                   "give the folder of a complete chat model (config, weights, tokenizer) as the local judge")


# ---- the TRL resumable stage's checkpoints -------------------------------------------------------------------

def test_trl_checkpoint_files(tmp_path):
    from setpo.trl.training import check_checkpoint, write_manifest

    run = tmp_path / "run"
    ckpt = run / "checkpoint-2"
    ckpt.mkdir(parents=True)
    state = json.dumps({"global_step": 2, "max_steps": 4, "log_history": [{"loss": 1.0}] * 8}).encode()
    (ckpt / "trainer_state.json").write_bytes(state)
    torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    write_manifest(ckpt)
    messages = {}
    for fault in FAULTS:
        data = fault_bytes(fault, state, pickle.dumps(Payload(tmp_path / "pwned")))[: len(state)]
        data = data + b" " * (len(state) - len(data))  # the manifest's size: the check reads the bytes
        messages[fault] = refused(lambda p: check_checkpoint(ckpt), ckpt / "trainer_state.json", data)
    check_refusals(messages, "checkpoint-2/trainer_state.json", "delete checkpoint-2 to resume from an earlier "
                   "checkpoint")


def test_a_tiny_models_tokenizer_is_read_as_saved_not_as_its_model_configs(tiny_model):
    """``toolkit.load_model(tiny=True)``, which the Countdown study reads its trained models with, gives the saved
    tokenizer's tokens; AutoTokenizer follows the folder's qwen2 config to another tokenizer that splits the same
    text differently (a run trained on it would be another run)."""
    from transformers import AutoTokenizer

    from setpo.trl.tiny_models import build_chat_tokenizer
    from setpo_lab.studies.toolkit import load_model, load_tokenizer

    text = "1 2 + 3 = 6"
    saved = build_chat_tokenizer()(text).input_ids
    tokenizer, model = load_model(tiny_model, torch.float32, remedy="r", tiny=True)
    assert tokenizer(text).input_ids == saved and model.dtype == torch.float32
    assert load_tokenizer(tiny_model, remedy="r", tiny=True)(text).input_ids == saved
    assert AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)(text).input_ids != saved
