"""Writing checkpoint folders crash-safely, and loading them safely (tampered / truncated files)."""

import hashlib
import json
import os
import pickle
import re
import threading

import pytest
import safetensors
import safetensors.torch
import torch
from torch import nn

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.checkpointing import safe_load as ckpt_format
from hf_lightning.checkpointing.completeness import is_complete_checkpoint
from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.checkpointing.reader import load_model_weights, load_optimizer_and_scheduler, load_scaler
from hf_lightning.checkpointing.safe_load import load_training_args
from hf_lightning.checkpointing.writer import save_model_files, write_checkpoint
from hf_lightning.checkpointing.rng import restore_rng_state
from hf_lightning.state import TrainerState

FULL_FILES = {
    "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
    "training_args.bin", "training_args.json",
}


class TiedNet(nn.Module):
    """A plain module (no save_pretrained) whose output layer shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.hidden = nn.Linear(4, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(self.hidden(self.embed(ids)))


class Payload:
    """Unpickling this creates `marker` (a directory): proof that code ran during loading."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _training_parts(seed=0):
    torch.manual_seed(seed)
    model = TiedNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 10)
    model(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _write(run_dir, step=1, *, parts=None, state=None, args=None, **kwargs):
    model, optimizer, scheduler = parts or _training_parts()
    return write_checkpoint(
        run_dir, step, model=model, optimizer=optimizer, scheduler=scheduler,
        state=state or TrainerState(global_step=step), args=args or TrainingArguments(output_dir=str(run_dir)),
        **kwargs,
    )


def _digest(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


# ---- writing ---------------------------------------------------------------------------------------------------


def test_plain_module_checkpoint_files_and_round_trip(tmp_path):
    model, optimizer, scheduler = _training_parts()
    path = _write(tmp_path, 3, parts=(model, optimizer, scheduler))

    assert path == os.path.join(str(tmp_path), "checkpoint-3")
    assert set(os.listdir(path)) == FULL_FILES
    assert os.listdir(tmp_path) == ["checkpoint-3"]
    with safetensors.safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        # Tied weights are stored as two copies (HF's save_file would refuse shared tensors).
        assert set(f.keys()) == {"embed.weight", "hidden.weight", "hidden.bias", "out.weight"}

    restored, restored_optimizer, restored_scheduler = _training_parts(seed=1)
    assert load_model_weights(restored, path, strict=True) == ([], [])
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), model.state_dict().values()))
    assert restored.out.weight is restored.embed.weight  # tying survives loading
    assert load_optimizer_and_scheduler(restored_optimizer, restored_scheduler, path) is True
    assert restored_scheduler.state_dict() == scheduler.state_dict()
    assert torch.equal(restored_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0][
        "exp_avg"])


def test_training_args_json_is_preferred_and_matches_to_json_string(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), save_steps=7, hub_token="secret")
    path = _write(tmp_path, args=args)
    values = load_training_args(path)
    assert values == json.loads(args.to_json_string())
    assert values["save_steps"] == 7
    os.remove(os.path.join(path, "training_args.json"))
    # Without the JSON, the pickle is decoded without importing our class.
    from_bin = load_training_args(path)
    assert from_bin["save_steps"] == 7
    assert from_bin["hub_token"] == "<HUB_TOKEN>"


def test_load_training_args_absent_returns_none(tmp_path):
    assert load_training_args(tmp_path) is None


def test_save_only_model_writes_model_state_and_args_only(tmp_path):
    path = _write(tmp_path, save_only_model=True)
    assert set(os.listdir(path)) == {"model.safetensors", "trainer_state.json", "training_args.bin",
                                     "training_args.json"}
    _, optimizer, scheduler = _training_parts(seed=1)
    assert load_optimizer_and_scheduler(optimizer, scheduler, path) is False
    assert restore_rng_state(path) is False


def test_scaler_written_only_when_given_and_restored(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    path = _write(tmp_path, scaler=scaler)
    assert "scaler.pt" in os.listdir(path)
    other = torch.amp.GradScaler("cpu", init_scale=2.0)
    assert load_scaler(other, path) is True
    assert other.state_dict() == scaler.state_dict()
    assert load_scaler(other, _write(tmp_path / "b")) is False


def test_rewriting_a_step_replaces_the_folder_whole(tmp_path):
    path = _write(tmp_path, 2)
    with open(os.path.join(path, "stale.txt"), "w") as f:
        f.write("from the first save")
    assert _write(tmp_path, 2) == path
    assert set(os.listdir(path)) == FULL_FILES
    assert os.listdir(tmp_path) == ["checkpoint-2"]


@pytest.mark.parametrize("best_step,strategy,expected", [
    (4, "steps", "checkpoint-4"),   # the folder being written
    (2, "epoch", "checkpoint-2"),   # an existing earlier folder
    (3, "steps", None),             # its folder was rotated away
    (4, "no", None),                # HF only tracks it for steps / epoch / best saving
    (None, "steps", None),
])
def test_best_model_checkpoint_set_like_hf(tmp_path, best_step, strategy, expected):
    _write(tmp_path, 2)
    state = TrainerState(global_step=4, best_global_step=best_step)
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy=strategy)
    path = _write(tmp_path, 4, state=state, args=args)
    saved = json.loads(open(os.path.join(path, "trainer_state.json")).read())
    expected_path = None if expected is None else os.path.join(str(tmp_path), expected)
    assert saved["best_model_checkpoint"] == state.best_model_checkpoint == expected_path


def test_callback_states_stored_in_trainer_state(tmp_path):
    states = {"EarlyStoppingCallback": {"args": {"early_stopping_patience": 2}, "attributes": {
        "early_stopping_patience_counter": 1}}}
    path = _write(tmp_path, extra_callback_states=states)
    saved = TrainerState.load_from_json(os.path.join(path, "trainer_state.json"))
    assert saved.stateful_callbacks == states


def test_save_model_files_saves_collator_tokenizer(tmp_path):
    saved_to = []

    class Tokenizer:
        def save_pretrained(self, folder):
            saved_to.append(folder)

    class Collator:
        tokenizer = Tokenizer()

    save_model_files(TiedNet(), tmp_path, data_collator=Collator())
    assert saved_to == [str(tmp_path)]
    assert os.listdir(tmp_path) == ["model.safetensors"]


@pytest.mark.parametrize("missing", ["optimizer", "scheduler"])
def test_full_checkpoint_without_optimizer_or_scheduler_is_refused(tmp_path, missing):
    model, optimizer, scheduler = _training_parts()
    parts = {"optimizer": optimizer, "scheduler": scheduler, missing: None}
    with pytest.raises(ValueError, match=rf"{missing}=None.*save_only_model=True"):
        write_checkpoint(tmp_path, 1, model=model, state=TrainerState(), args=None, **parts)
    assert os.listdir(tmp_path) == []


def test_several_processes_need_a_barrier(tmp_path):
    with pytest.raises(ValueError, match="needs `barrier`"):
        _write(tmp_path, world_size=2)


def test_several_processes_share_one_folder(tmp_path):
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def process(rank):
        try:
            results[rank] = _write(tmp_path, 5, process_index=rank, world_size=2, should_save=rank == 0,
                                   barrier=barrier.wait)
        except BaseException as err:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=process, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert results[0] == results[1] == os.path.join(str(tmp_path), "checkpoint-5")
    assert set(os.listdir(results[0])) == FULL_FILES - {"rng_state.pth"} | {"rng_state_0.pth", "rng_state_1.pth"}
    assert os.listdir(tmp_path) == ["checkpoint-5"]
    assert restore_rng_state(results[0], process_index=1, world_size=2) is True


# ---- crash safety ----------------------------------------------------------------------------------------------


def _fail_on(name):
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if str(path).endswith(name):
            raise OSError(f"disk full while writing {name}")
        return real_save(obj, path, *args, **kwargs)

    return save


@pytest.mark.parametrize("failing_file", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"])
def test_crash_mid_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch, failing_file):
    previous = _write(tmp_path, 1)
    before = _digest(previous)
    monkeypatch.setattr(torch, "save", _fail_on(failing_file))

    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path, 2)

    assert os.listdir(tmp_path) == ["checkpoint-1"]
    assert _digest(previous) == before
    assert get_last_checkpoint(tmp_path) == previous


def test_crash_writing_trainer_state_when_replacing_keeps_old_folder(tmp_path, monkeypatch):
    previous = _write(tmp_path, 2)
    before = _digest(previous)

    def broken_save(self, path):
        raise OSError("killed")

    monkeypatch.setattr(TrainerState, "save_to_json", broken_save)
    with pytest.raises(OSError, match="killed"):
        _write(tmp_path, 2)
    assert os.listdir(tmp_path) == ["checkpoint-2"]
    assert _digest(previous) == before


def test_leftover_of_a_killed_save_is_ignored(tmp_path):
    previous = _write(tmp_path, 1)
    # A kill -9 during the save of step 2 leaves only the temporary folder.
    leftover = tmp_path / ".tmp-checkpoint-2-99999"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    assert get_last_checkpoint(tmp_path) == previous
    assert not is_complete_checkpoint(leftover)
    # Saving that step again works and does not touch another process's temporary folder.
    assert _write(tmp_path, 2) == os.path.join(str(tmp_path), "checkpoint-2")
    assert leftover.is_dir()


# ---- safe loading ----------------------------------------------------------------------------------------------


def test_payload_is_live(tmp_path):
    # The planted object really runs code under a plain unpickler; the tests below show ours never does.
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").is_dir()


def _load_everything(path):
    model, optimizer, scheduler = _training_parts(seed=1)
    load_model_weights(model, path)
    load_optimizer_and_scheduler(optimizer, scheduler, path)
    restore_rng_state(path)
    load_scaler(torch.amp.GradScaler("cpu"), path)


@pytest.mark.parametrize("target", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt",
                                    "pytorch_model.bin"])
def test_tampered_file_is_refused_without_running_code(tmp_path, target):
    path = _write(tmp_path / "run", scaler=torch.amp.GradScaler("cpu"))
    if target == "pytorch_model.bin":
        os.remove(os.path.join(path, "model.safetensors"))
    marker = tmp_path / "payload_ran"
    torch.save({"state": {}, "param_groups": [], "evil": Payload(marker)}, os.path.join(path, target))

    refused = rf"Cannot load .*{re.escape(target)}: it references `\w+\.mkdir`.*delete that folder"
    with pytest.raises(CheckpointLoadError, match=refused) as err:
        _load_everything(path)

    assert not marker.exists()
    assert isinstance(err.value, ValueError)
    assert err.value.path == os.path.join(path, target)
    assert "weights_only=False" not in str(err.value)
    assert err.value.__cause__ is None  # torch's own message (which suggests weights_only=False) is not chained


@pytest.mark.parametrize("target", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "model.safetensors"])
@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_truncated_file_is_refused(tmp_path, target, keep):
    path = _write(tmp_path)
    file = os.path.join(path, target)
    data = open(file, "rb").read()
    with open(file, "wb") as f:
        f.write(data[: int(len(data) * keep)])

    with pytest.raises(CheckpointLoadError, match=rf"Cannot load .*{target}: the file is truncated or corrupt"):
        _load_everything(path)


def test_damaged_optimizer_leaves_optimizer_and_scheduler_untouched(tmp_path):
    path = _write(tmp_path)
    with open(os.path.join(path, "scheduler.pt"), "wb") as f:
        f.write(b"garbage")
    _, optimizer, scheduler = _training_parts(seed=1)
    before = (optimizer.state_dict()["state"][0]["exp_avg"].clone(), scheduler.state_dict())
    with pytest.raises(CheckpointLoadError, match="scheduler.pt"):
        load_optimizer_and_scheduler(optimizer, scheduler, path)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], before[0])
    assert scheduler.state_dict() == before[1]


def test_tampered_training_args_bin_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "payload_ran"
    torch.save({"output_dir": "x", "evil": Payload(marker)}, tmp_path / "training_args.bin")
    with pytest.raises(CheckpointLoadError, match=r"training_args\.bin: it references `posix\.mkdir`"):
        load_training_args(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]"])
def test_invalid_training_args_json(tmp_path, content):
    (tmp_path / "training_args.json").write_bytes(content)
    with pytest.raises(CheckpointLoadError, match="training_args.json"):
        load_training_args(tmp_path)


def test_truncated_training_args_bin(tmp_path):
    torch.save({"output_dir": "x"}, tmp_path / "training_args.bin")
    data = (tmp_path / "training_args.bin").read_bytes()
    (tmp_path / "training_args.bin").write_bytes(data[:20])
    with pytest.raises(CheckpointLoadError, match="training_args.bin: the file is truncated or corrupt"):
        load_training_args(tmp_path)


def test_shard_index_pointing_outside_the_folder_is_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../elsewhere.bin"}}))
    with pytest.raises(CheckpointLoadError, match="shard '../elsewhere.bin'"):
        load_model_weights(TiedNet(), tmp_path)


def test_pickled_weights_and_strict_mismatch(tmp_path):
    source = TiedNet()
    state = source.state_dict()
    del state["hidden.bias"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    target = TiedNet()
    result = load_model_weights(target, tmp_path)
    assert result.missing_keys == ["hidden.bias"]
    assert torch.equal(target.hidden.weight, source.hidden.weight)
    with pytest.raises(RuntimeError, match="hidden.bias"):
        load_model_weights(TiedNet(), tmp_path, strict=True)


def test_safe_torch_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="optimizer.pt does not exist"):
        ckpt_format.safe_torch_load(tmp_path / "optimizer.pt")
