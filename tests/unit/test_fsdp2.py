"""FSDP2 (fsdp_config version 2): the arguments read as transformers 5.23 + accelerate read them, and the model
sharded into the same groups as accelerate's FSDP2 preparation (one process, gloo; no torchrun)."""

import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import transformers
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy, fsdp2_prepare_model

import hf_lightning
from hf_lightning.sharding import HFFSDP2Strategy, _layer_matcher, fsdp2_plan, shard_model
from hf_lightning.trainer.strategies import resolve_strategy
from tests.helpers.models import tiny_gpt2

CONFIGS = [
    (True, None),
    ("full_shard", {"transformer_layer_cls_to_wrap": "GPT2Block"}),
    ("shard_grad_op offload", {"transformer_layer_cls_to_wrap": ["GPT2Block"], "activation_checkpointing": True,
                               "state_dict_type": "SHARDED_STATE_DICT"}),
    (True, {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 3000}),
    (True, {"auto_wrap_policy": "NO_WRAP", "reshard_after_forward": "false"}),
]


def _both(tmp_path, fsdp, config, **kw):
    common = dict(output_dir=str(tmp_path), fsdp=fsdp, fsdp_config=config, use_cpu=True, report_to="none", **kw)
    return transformers.TrainingArguments(**common), hf_lightning.TrainingArguments(**common)


@pytest.mark.parametrize("fsdp,config", CONFIGS)
def test_plan_reads_fsdp_config_as_hf_and_accelerate(tmp_path, fsdp, config):
    from torch.distributed.fsdp import CPUOffloadPolicy

    hf_args, args = _both(tmp_path, fsdp, config)
    plugin = FullyShardedDataParallelPlugin(**hf_args.fsdp_plugin_args)
    plan = fsdp2_plan(args)
    assert plan.reshard_after_forward == plugin.reshard_after_forward
    assert plan.cpu_offload == isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    assert plan.state_dict_type == plugin.state_dict_type.name
    assert plan.activation_checkpointing == bool(plugin.activation_checkpointing)
    # The modules that get their own group (and activation checkpointing): accelerate's policy, module by module.
    model = tiny_gpt2()
    theirs = fsdp2_prepare_auto_wrap_policy(plugin, model)
    ours = _layer_matcher(model, plan)
    expected = [name for name, m in model.named_modules() if theirs is not None and theirs(m)
                and not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))]  # see the size-based test below
    assert [name for name, m in model.named_modules() if ours is not None and ours(m)] == expected
    if config is None:  # no transformer_layer_cls_to_wrap: the model's _no_split_modules (GPT2Block)
        assert expected == ["transformer.h.0", "transformer.h.1"]


def test_sharded_state_dict_is_read_without_a_warning(tmp_path, caplog):
    args = _both(tmp_path, True, {"state_dict_type": "SHARDED_STATE_DICT"})[1]
    with caplog.at_level("WARNING", logger="hf_lightning.sharding"):
        assert fsdp2_plan(args).state_dict_type == "SHARDED_STATE_DICT"
    assert not caplog.text  # checkpoints are written sharded (tests/distributed/test_fsdp_layout.py)
    with pytest.raises(ValueError, match="state_dict_type.*LOCAL"):
        fsdp2_plan(_both(tmp_path, True, {"state_dict_type": "LOCAL_STATE_DICT"})[1])


def test_bf16_gathers_and_reduces_in_bf16(tmp_path):
    assert fsdp2_plan(_both(tmp_path, True, None, bf16=True)[1]).param_dtype == torch.bfloat16
    assert fsdp2_plan(_both(tmp_path, True, None)[1]).param_dtype is None


def test_version_2_maps_to_model_parallel_strategy_on_the_cpu(tmp_path):
    from lightning.pytorch.strategies import ModelParallelStrategy

    args = _both(tmp_path, "shard_grad_op", {"transformer_layer_cls_to_wrap": ["GPT2Block"],
                                             "state_dict_type": "SHARDED_STATE_DICT"}, ddp_timeout=60)[1]
    cls, kwargs = resolve_strategy(args, world_size=4, on_cpu=True)
    assert cls is HFFSDP2Strategy
    strategy = cls(**kwargs)
    assert isinstance(strategy, ModelParallelStrategy)
    # One data-parallel dimension over every process, no tensor parallelism.
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)
    assert strategy._save_distributed_checkpoint is True
    assert strategy._timeout == timedelta(seconds=60)
    assert strategy.plan.reshard_after_forward is False


def test_version_1_is_refused_on_the_cpu_and_unknown_versions_everywhere(tmp_path):
    with pytest.raises(ValueError, match=r"fsdp_config\['version'\]=1 needs CUDA.*FSDP2"):
        resolve_strategy(_both(tmp_path, True, {"version": 1})[1], world_size=2, on_cpu=True)
    with pytest.raises(ValueError, match=r"fsdp_config\['version'\]=3"):
        resolve_strategy(_both(tmp_path, True, {"version": 3})[1], world_size=2, on_cpu=False)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_cpu_offload_is_accepted_on_the_cpu_and_on_gpus(tmp_path, on_cpu):
    # torch's CPUOffloadPolicy trains on CPU processes too (the shards stay in CPU memory): the slow torchrun test
    # test_fsdp2_options_train_as_without_them runs it.
    cls, kwargs = resolve_strategy(_both(tmp_path, "full_shard offload", None)[1], world_size=2, on_cpu=on_cpu)
    assert kwargs["plan"].cpu_offload is True


def test_unknown_layer_class_is_named(tmp_path):
    plan = fsdp2_plan(_both(tmp_path, True, {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})[1])
    with pytest.raises(ValueError, match="LlamaDecoderLayer.*GPT2LMHeadModel"):
        _layer_matcher(tiny_gpt2(), plan)


@pytest.fixture
def one_process_group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _layout(model):
    from torch.distributed.fsdp import FSDPModule

    return [(name, type(m).__name__, isinstance(m, FSDPModule)) for name, m in model.named_modules()]


@pytest.mark.parametrize("fsdp,config", [
    CONFIGS[0],
    ("shard_grad_op", {"transformer_layer_cls_to_wrap": ["GPT2Block"], "activation_checkpointing": True}),
])
def test_shard_model_builds_accelerates_groups(tmp_path, one_process_group, fsdp, config):
    hf_args, args = _both(tmp_path, fsdp, config)
    plugin = FullyShardedDataParallelPlugin(**hf_args.fsdp_plugin_args)
    theirs = tiny_gpt2()
    if plugin.activation_checkpointing:
        from accelerate.utils.fsdp_utils import fsdp2_apply_ac

        fake = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin))
        fsdp2_apply_ac(fake, theirs)
    fake = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                 is_main_process=True, torch_device_mesh=None, device=torch.device("cpu"))
    fsdp2_prepare_model(fake, theirs)
    ours = shard_model(tiny_gpt2(), fsdp2_plan(args))
    assert _layout(ours) == _layout(theirs)
    assert shard_model(ours, fsdp2_plan(args)) is ours  # a sharded model is left alone


def test_size_based_wrap_skips_layer_containers_where_accelerate_fails(tmp_path, one_process_group):
    hf_args, args = _both(tmp_path, *CONFIGS[3])
    plugin = FullyShardedDataParallelPlugin(**hf_args.fsdp_plugin_args)
    fake = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                 is_main_process=True, torch_device_mesh=None, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="containers that do not implement forward"):
        fsdp2_prepare_model(fake, tiny_gpt2())  # HF's own FSDP2 run stops here (transformer.h is a ModuleList)
    sharded = {name for name, _, is_fsdp in _layout(shard_model(tiny_gpt2(), fsdp2_plan(args))) if is_fsdp}
    # The blocks get groups; the ModuleList cannot, and neither can `transformer`, which holds wte but not the lm_head
    # tied to it: the tied pair gets one group with ln_f, as in accelerate's layout.
    assert {"transformer.h.0", "transformer.h.1", "transformer.wte", "transformer.ln_f", "lm_head"} <= sharded
    assert not {"transformer.h", "transformer"} & sharded


def test_fsdp2_model_state_writes_and_reads_an_unsharded_runs_folder(tmp_path, one_process_group):
    from hf_lightning.checkpointing.model_state import FSDP2ModelState, PlainModelState, model_state_for
    from hf_lightning.sharding import full_state_dict

    plan = fsdp2_plan(_both(tmp_path, True, None)[1])
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "labels": torch.tensor([[1, 2, 3, 4]])}
    model = shard_model(tiny_gpt2(), plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**batch).loss.backward()
    optimizer.step()
    state = model_state_for(model)
    assert isinstance(state, FSDP2ModelState)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    state.write(state.gather(model, str(folder)), str(folder))
    torch.save(state.optimizer_state(model, optimizer), folder / "optimizer.pt")
    expected = full_state_dict(model)

    # An unsharded model and its optimizer read the folder as their own.
    plain = tiny_gpt2(seed=1)
    PlainModelState().load(plain, str(folder))
    for key, value in plain.state_dict().items():
        assert torch.equal(value, expected[key]), key
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    plain_optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    assert len(plain_optimizer.state) == len(list(plain.parameters()))

    # And a fresh sharded model gets the same weights and optimizer state back.
    fresh = shard_model(tiny_gpt2(seed=1), plan)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    state.load(fresh, str(folder), strict=True)
    state.load_optimizer_state(fresh, fresh_optimizer, torch.load(folder / "optimizer.pt", weights_only=True))
    for key, value in full_state_dict(fresh).items():
        assert torch.equal(value, expected[key]), key
    mine, theirs = state.optimizer_state(fresh, fresh_optimizer), state.optimizer_state(model, optimizer)
    def groups(state):  # torch.load(weights_only=True) gives lists where the optimizer holds tuples (betas)
        return [{**group, "betas": tuple(group["betas"])} for group in state["param_groups"]]

    assert groups(mine) == groups(theirs)
    for index, values in theirs["state"].items():
        for key, value in values.items():
            assert torch.equal(mine["state"][index][key], value), (index, key)


def test_block_backward_sync_keeps_gradients_local_until_the_windows_last_backward(tmp_path, one_process_group):
    from torch.distributed.fsdp import FSDPModule

    plan = fsdp2_plan(_both(tmp_path, True, None)[1])
    strategy = HFFSDP2Strategy(plan, world_size=1)
    model = shard_model(tiny_gpt2(), plan)
    strategy.model = model
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def syncing():
        # torch keeps FSDP2's no_sync flag on each group's param group (public setter, no public getter).
        return {getattr(m._get_fsdp_state()._fsdp_param_group, "reduce_grads", True) for m in groups}

    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "labels": torch.tensor([[1, 2, 3, 4]])}
    with strategy.block_backward_sync():
        assert syncing() == {False}
        model(**batch).loss.backward()
    assert syncing() == {True}
    # The earlier micro-batch's gradients are kept unsharded and local; the last backward reduces them.
    model(**batch).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def _tiny_t5(tied=True):
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                                   num_heads=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(config)
    if not tied:
        # transformers 5.23 always ties T5's lm_head; untied by hand, the embeddings' group has no output embedding.
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_t5_embeddings_share_one_group_where_accelerate_fails(tmp_path, one_process_group, tied):
    hf_args, args = _both(tmp_path, True, {"transformer_layer_cls_to_wrap": ["T5Block"]})
    plugin = FullyShardedDataParallelPlugin(**hf_args.fsdp_plugin_args)
    fake = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                 is_main_process=True, torch_device_mesh=None, device=torch.device("cpu"))
    batch = {"input_ids": torch.tensor([[5, 6, 7, 1]]), "labels": torch.tensor([[8, 9, 1]])}
    theirs = fsdp2_prepare_model(fake, _tiny_t5(tied))
    # accelerate leaves encoder/decoder.embed_tokens (holding `shared.weight`) to the root: torch refuses it.
    with pytest.raises(ValueError, match="shared with a parameter already managed by another FSDP group"):
        theirs(**batch)
    plain = _tiny_t5(tied)
    expected_loss = plain(**batch).loss
    expected_ids = plain.generate(input_ids=batch["input_ids"], max_length=6, do_sample=False)
    ours = shard_model(_tiny_t5(tied), fsdp2_plan(args))
    embeddings = ["shared", "encoder.embed_tokens", "decoder.embed_tokens"] + (["lm_head"] if tied else [])
    states = {id(ours.get_submodule(name)._get_fsdp_state()) for name in embeddings}
    assert len(states) == 1  # one group for the modules holding the embedding's weight
    assert (id(ours.lm_head._get_fsdp_state()) in states) == tied  # an untied lm_head: the tail group
    assert ours.encoder.embed_tokens.weight is ours.shared.weight  # still tied, now one sharded parameter
    torch.testing.assert_close(ours(**batch).loss, expected_loss)
    # generate runs the encoder outside the root's forward: registered as a forward method, it gathers the root.
    assert torch.equal(ours.generate(input_ids=batch["input_ids"], max_length=6, do_sample=False), expected_ids)
