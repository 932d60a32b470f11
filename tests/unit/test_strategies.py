"""HF's distributed arguments → Lightning strategies (checked on the objects, no processes started)."""

import os
from datetime import timedelta

import pytest

import hf_lightning
from hf_lightning.trainer.strategies import process_layout, resolve_strategy


def _args(tmp_path, **kw):
    return hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw)


def test_one_process_uses_lightning_default(tmp_path):
    assert resolve_strategy(_args(tmp_path), world_size=1, on_cpu=True) is None


def test_ddp_options_map_to_ddp_strategy(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy

    args = _args(tmp_path, ddp_backend="gloo", ddp_find_unused_parameters=False, ddp_bucket_cap_mb=10,
                 ddp_broadcast_buffers=False, ddp_static_graph=True, ddp_timeout=60)
    cls, kwargs = resolve_strategy(args, world_size=2, on_cpu=True)
    assert cls is DDPStrategy
    assert kwargs == {"process_group_backend": "gloo", "timeout": timedelta(seconds=60),
                      "find_unused_parameters": False, "bucket_cap_mb": 10, "broadcast_buffers": False,
                      "static_graph": True}
    strategy = cls(**kwargs)
    assert strategy._ddp_kwargs["bucket_cap_mb"] == 10
    assert strategy.process_group_backend == "gloo"


def test_ddp_defaults_follow_hf(tmp_path):
    _, kwargs = resolve_strategy(_args(tmp_path), world_size=4, on_cpu=False)
    assert kwargs["process_group_backend"] == "nccl"
    assert kwargs["find_unused_parameters"] is True
    _, kwargs = resolve_strategy(_args(tmp_path, activation_checkpointing=True), world_size=4, on_cpu=True)
    assert kwargs["find_unused_parameters"] is False


def test_fsdp_config_maps_to_fsdp_strategy(tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy

    args = _args(tmp_path, fsdp="shard_grad_op offload",
                 fsdp_config={"version": 1, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                              "activation_checkpointing": True,
                              "state_dict_type": "SHARDED_STATE_DICT"})
    cls, kwargs = resolve_strategy(args, world_size=2, on_cpu=False)
    assert cls is FSDPStrategy
    assert kwargs["sharding_strategy"] == "SHARD_GRAD_OP"
    assert kwargs["cpu_offload"] is True
    assert kwargs["state_dict_type"] == "sharded"

    class GPT2Block:  # the policy matches by class name, resolved on the real model later
        pass

    policy = kwargs["auto_wrap_policy"]
    assert policy.keywords["lambda_fn"](GPT2Block())
    assert not policy.keywords["lambda_fn"](object())
    strategy = cls(**kwargs)
    assert strategy.sharding_strategy.name == "SHARD_GRAD_OP"


def test_fsdp1_and_deepspeed_on_cpu_are_refused_clearly(tmp_path):
    fsdp1 = {"version": 1}
    with pytest.raises(ValueError, match=r"version'\]=1 needs CUDA"):
        resolve_strategy(_args(tmp_path, fsdp=True, fsdp_config=fsdp1), world_size=2, on_cpu=True)
    with pytest.raises(ValueError, match=r"version'\]=1 needs CUDA"):
        hf_lightning.build_lightning_trainer(_args(tmp_path, fsdp=True, fsdp_config=fsdp1))
    with pytest.raises(ValueError, match="deepspeed"):
        hf_lightning.build_lightning_trainer(_args(tmp_path, deepspeed={"zero_optimization": {"stage": 2}}))


def test_deepspeed_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="no such DeepSpeed config file"):
        resolve_strategy(_args(tmp_path, deepspeed=str(tmp_path / "nope.json")), world_size=2, on_cpu=False)


def test_process_layout_reads_the_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert process_layout() == (4, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="multiple"):
        process_layout()
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    assert process_layout() == (1, 1)
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NNODES", "2")
    assert process_layout() == (4, 2)
