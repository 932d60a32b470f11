"""``parallelism_config`` (accelerate's ``ParallelismConfig``) → the Lightning strategy and mesh hf_lightning runs.

HF's Trainer refuses every ``ParallelismConfig`` with more than one process in its layout on CPU processes
(accelerate: "only compatible DistributedType.FSDP (version 2) or DistributedType.Multi{Device} ...", measured under
torchrun with gloo), so the mapping is checked here on the objects it builds, and run in
``tests/distributed/test_fsdp.py`` against HF's plain multi-process run (the numbers any data-parallel layout gives).
"""

import json

import pytest
from accelerate.parallelism_config import ParallelismConfig
from lightning.pytorch.strategies import DDPStrategy

import hf_lightning
from hf_lightning.args.parallelism import ParallelismPlan, data_parallel_layout, parallelism_plan
from hf_lightning.sharding import HFFSDP2Strategy
from hf_lightning.tensor_parallel import HFTensorParallelStrategy
from hf_lightning.trainer.strategies import resolve_strategy


def _args(tmp_path, **kw):
    return hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw)


@pytest.mark.parametrize("sizes, plan", [
    ({}, ParallelismPlan(1, 1)),
    ({"dp_shard_size": 2}, ParallelismPlan(1, 2)),
    ({"dp_replicate_size": 2}, ParallelismPlan(2, 1)),
    ({"dp_replicate_size": 2, "dp_shard_size": 4}, ParallelismPlan(2, 4)),
    ({"tp_size": 2}, ParallelismPlan(1, 1, 2)),
])
def test_accelerate_config_and_dict_read_the_same(sizes, plan):
    assert parallelism_plan(ParallelismConfig(**sizes)) == plan
    assert parallelism_plan(sizes) == plan
    assert parallelism_plan(None) is None


# (sizes, world size, fsdp arguments, expected strategy class, replicate groups)
MAPPING = [
    ({"dp_shard_size": 2}, 2, {}, HFFSDP2Strategy, 1),
    ({"dp_shard_size": 2}, 2, {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": ["GPT2Block"]}},
     HFFSDP2Strategy, 1),
    ({"dp_replicate_size": 2, "dp_shard_size": 2}, 4, {"fsdp": True}, HFFSDP2Strategy, 2),
    ({"dp_replicate_size": 2}, 2, {}, DDPStrategy, None),
    ({}, 2, {}, DDPStrategy, None),  # accelerate: every size 1 → dp_replicate = the number of processes
    ({"tp_size": 2}, 2, {}, HFTensorParallelStrategy, None),
]


@pytest.mark.parametrize("sizes, world, fsdp, cls, replicate", MAPPING, ids=repr)
def test_sizes_map_to_lightning_strategies(tmp_path, sizes, world, fsdp, cls, replicate):
    args = _args(tmp_path, parallelism_config=ParallelismConfig(**sizes), **fsdp)
    got, kwargs = resolve_strategy(args, world_size=world, on_cpu=True)
    assert got is cls
    if cls is HFFSDP2Strategy:
        strategy = cls(**kwargs)
        assert strategy.replicate == replicate
        assert strategy._data_parallel_size == world and strategy._tensor_parallel_size == 1
        if fsdp.get("fsdp_config"):
            assert strategy.plan.layer_classes == ("GPT2Block",)
    if cls is HFTensorParallelStrategy:
        strategy = cls(**kwargs)
        assert strategy.tp_size == 2
        assert strategy._data_parallel_size == 1 and strategy._tensor_parallel_size == 2


def test_tensor_parallel_processes_share_their_batches():
    # The tensor-parallel dimension is the innermost of the mesh: both processes of the group load batch share 0.
    assert data_parallel_layout(2, 1, ParallelismConfig(tp_size=2)) == (1, 0)
    assert data_parallel_layout(2, 1, ParallelismConfig(dp_shard_size=2)) == (2, 1)
    assert data_parallel_layout(2, 1, None) == (2, 1)


def test_tensor_parallel_needs_a_model_transformers_sharded_with_that_size():
    from torch import nn

    strategy = HFTensorParallelStrategy(tp_size=2)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"tp_size=2: the model is not tensor-parallel.*tp_plan='auto'"):
        strategy.check_model(model)
    model.weight.device_mesh = object()  # what a DTensor parameter has
    model._tp_size = 4
    with pytest.raises(ValueError, match=r"tp_size=2, but the model was loaded with tp_size=4"):
        strategy.check_model(model)
    model._tp_size = 2
    strategy.check_model(model)


def test_one_process_layout_leaves_the_other_arguments_in_charge(tmp_path):
    assert resolve_strategy(_args(tmp_path, parallelism_config=ParallelismConfig()), 1, True) is None
    cls, _ = resolve_strategy(_args(tmp_path, parallelism_config=ParallelismConfig(), fsdp=True), 1, True)
    assert cls is HFFSDP2Strategy


@pytest.mark.parametrize("sizes, world, extra, message", [
    ({"dp_shard_size": 2}, 4, {}, r"dp_replicate_size \(1\) x dp_shard_size \(2\) x tp_size \(1\) = 2 does not "
                                  r"match the number of processes \(4\)"),
    ({"dp_replicate_size": 2}, 2, {"fsdp": True}, r"FSDP has no dimension to shard across"),
    ({}, 2, {"fsdp": True}, r"FSDP has no dimension to shard across"),
    ({"tp_size": 2}, 2, {"fsdp": True}, r"FSDP has no dimension to shard across"),
    ({"tp_size": 2}, 4, {}, r"x tp_size \(2\) = 2 does not match the number of processes \(4\)"),
    ({"dp_shard_size": 2}, 2, {"fsdp": True, "fsdp_config": {"version": 1}}, r"FSDP2 only.*version'\]=2"),
    ({"dp_shard_size": 2}, 2, {"fsdp": True, "fsdp_config": {"version": 3}}, r"FSDP versions are 1 and 2"),
], ids=repr)
def test_layouts_that_cannot_run_are_refused_before_work(tmp_path, sizes, world, extra, message):
    args = _args(tmp_path, parallelism_config=ParallelismConfig(**sizes), **extra)
    with pytest.raises(ValueError, match=message):
        resolve_strategy(args, world_size=world, on_cpu=True)


def test_hsdp_strategy_needs_replicas_that_divide_the_processes():
    from hf_lightning.sharding import FSDP2Plan

    with pytest.raises(ValueError, match=r"replicate=3 does not divide world_size=4"):
        HFFSDP2Strategy(FSDP2Plan(), world_size=4, replicate=3)


@pytest.mark.parametrize("sizes, message", [
    ({"tp_size": 2, "dp_shard_size": 2}, r"parallelism_config.tp_size=2 with dp_replicate_size=1 / dp_shard_size=2: "
                                         r"tensor parallelism combined with data parallelism is not supported yet"),
    ({"cp_size": 2}, r"parallelism_config.cp_size=2: context parallelism is not supported.*ring attention.*"
                     r"Set cp_size=1"),
    ({"dp_shard_size": 2, "cp_size": 2}, r"parallelism_config.cp_size=2"),
], ids=repr)
def test_dimensions_hf_cannot_run_here_are_refused_at_construction(sizes, message):
    with pytest.raises(ValueError, match=message):
        hf_lightning.TrainingArguments(parallelism_config=ParallelismConfig(**sizes))


@pytest.mark.parametrize("config, message", [
    ({"sp_size": 2}, r"parallelism_config.sp_size=2: sequence parallelism .*DeepSpeed.*Set sp_size=1"),
    ({"dp_shard_size": 0}, r"parallelism_config.dp_shard_size=0: sizes are whole numbers of at least 1"),
    ({"tp_sz": 2}, r"unknown keys \['tp_sz'\]"),
    ("fsdp", r"expected accelerate's ParallelismConfig"),
], ids=repr)
def test_bad_configs_name_the_setting(config, message):
    with pytest.raises(ValueError, match=message):
        hf_lightning.TrainingArguments(parallelism_config=config)


def test_deepspeed_with_a_layout_is_refused(tmp_path):
    args = _args(tmp_path, parallelism_config=ParallelismConfig(dp_shard_size=2))
    args.deepspeed = {"zero_optimization": {"stage": 3}}
    with pytest.raises(ValueError, match=r"parallelism_config with deepspeed"):
        resolve_strategy(args, world_size=2, on_cpu=False)


def test_to_dict_writes_none_as_hf_does(tmp_path):
    import transformers

    config = ParallelismConfig(dp_shard_size=2)
    ours = _args(tmp_path, parallelism_config=config)
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), parallelism_config=config)
    assert theirs.to_dict()["parallelism_config"] is None  # accelerate's to_json() returns nothing
    assert ours.to_dict()["parallelism_config"] is None
    assert json.loads(ours.to_json_string())["parallelism_config"] is None
    assert ours.parallelism_config is config
