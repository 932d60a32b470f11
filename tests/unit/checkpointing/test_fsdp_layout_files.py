"""HF's FSDP checkpoint files read in one process, without FSDP: what accelerate's own ``save_fsdp_model`` /
``save_fsdp_optimizer`` write (FULL_STATE_DICT and SHARDED_STATE_DICT), and the refusals of unfinished or
tampered torch.distributed.checkpoint folders. The two-process cases are in tests/distributed/test_fsdp_layout.py."""

import os
import pickle
from types import SimpleNamespace

import pytest
import torch

from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.reader import load_model_weights, load_optimizer_and_scheduler
from hf_lightning.checkpointing.safe_load import verify_checkpoint_files


def _trained(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW([{"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
                                   {"params": [model[0].bias, model[1].weight, model[1].bias, model[2].bias],
                                    "weight_decay": 0.0}], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return model, optimizer, scheduler


def _accelerate_folder(folder, layout):
    """A checkpoint folder whose model and optimizer accelerate's own FSDP functions wrote (one process)."""
    from accelerate import PartialState
    from accelerate.utils import save_fsdp_model, save_fsdp_optimizer
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig,
                                        ShardedStateDictConfig, StateDictType)

    PartialState(cpu=True)  # accelerate's logging needs it
    full = layout == "FULL"
    plugin = SimpleNamespace(
        state_dict_type=StateDictType.FULL_STATE_DICT if full else StateDictType.SHARDED_STATE_DICT, fsdp_version=2,
        state_dict_config=FullStateDictConfig() if full else ShardedStateDictConfig(),
        optim_state_dict_config=FullOptimStateDictConfig() if full else ShardedOptimStateDictConfig())
    accelerator = SimpleNamespace(process_index=0, num_processes=1, is_main_process=True, is_fsdp2=True)
    model, optimizer, scheduler = _trained(0)
    for _ in range(2):
        model(torch.randn(5, 3)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
    save_fsdp_model(plugin, accelerator, model, folder)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    torch.save(scheduler.state_dict(), os.path.join(folder, "scheduler.pt"))
    return model, optimizer, scheduler


@pytest.mark.parametrize("layout,files", [("FULL", ["optimizer.bin", "pytorch_model_fsdp.bin", "scheduler.pt"]),
                                          ("SHARDED", ["optimizer_0", "pytorch_model_fsdp_0", "scheduler.pt"])])
def test_accelerates_fsdp_files_resume_in_one_process(tmp_path, layout, files):
    saved, saved_optimizer, saved_scheduler = _accelerate_folder(tmp_path, layout)
    assert sorted(os.listdir(tmp_path)) == files
    model, optimizer, scheduler = _trained(1)
    assert not torch.equal(model[0].weight, saved[0].weight)
    load_model_weights(model, tmp_path)
    assert load_optimizer_and_scheduler(optimizer, scheduler, tmp_path, model=model)
    for key, value in saved.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    expected, loaded = saved_optimizer.state_dict(), optimizer.state_dict()
    # (betas come back as a list from the full state, as in accelerate's own load)
    assert [{**g, "betas": tuple(g["betas"])} for g in loaded["param_groups"]] == expected["param_groups"]
    for index, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(loaded["state"][index][key], value), (index, key)
    assert scheduler.state_dict() == saved_scheduler.state_dict()


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.makedirs, (self.path,)


def test_unfinished_or_tampered_sharded_folders_are_refused_unread(tmp_path):
    _accelerate_folder(tmp_path, "SHARDED")
    (tmp_path / "trainer_state.json").write_text("{}")
    model, optimizer, scheduler = _trained(1)
    marker = tmp_path / "code-ran"
    # A save that did not finish: no `.metadata` (torch.distributed.checkpoint writes it last).
    metadata = tmp_path / "pytorch_model_fsdp_0" / ".metadata"
    kept = metadata.read_bytes()
    metadata.unlink()
    with pytest.raises(CheckpointLoadError, match="has no .metadata"):
        load_model_weights(model, tmp_path)
    # A `.metadata` naming anything but checkpoint metadata is never unpickled (nor by the resume's file check).
    metadata.write_bytes(pickle.dumps(_Marker(str(marker))))
    with pytest.raises(CheckpointLoadError, match="os.makedirs"):
        load_model_weights(model, tmp_path)
    with pytest.raises(CheckpointLoadError, match="os.makedirs"):
        verify_checkpoint_files(tmp_path)
    metadata.write_bytes(kept)
    load_model_weights(model, tmp_path)
    assert "pytorch_model_fsdp_0/.metadata" in verify_checkpoint_files(tmp_path)
    # A stored value (the optimizer's param groups are pickled values) that is not plain data is refused unread.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer)
    state["param_groups"][0]["lr"] = _Marker(str(marker))
    dcp.save({"optimizer": state}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "optimizer_0")))
    with pytest.raises(CheckpointLoadError, match="param_groups.0.lr"):
        load_optimizer_and_scheduler(optimizer, scheduler, tmp_path, model=model)
    assert not marker.exists()
