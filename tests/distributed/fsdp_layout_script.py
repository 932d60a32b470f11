"""Run by test_fsdp_layout.py under torchrun (2 processes, gloo): HF's FSDP checkpoint layout, both ways.

usage: fsdp_layout_script.py <work_dir> <result.json> <FULL|SHARDED>...

For each state_dict_type given:

1. our FSDP2 run, 4 steps, checkpoints at 2 and 4 (``checkpoint-2`` in HF's FSDP layout), then ``save_model()``,
   loaded by ``from_pretrained``;
2. accelerate's own ``load_fsdp_model`` / ``load_fsdp_optimizer`` read our ``checkpoint-2`` into a fresh
   ``fully_shard``-ed model and optimizer; their full state is recorded;
3. accelerate's own ``save_fsdp_model`` / ``save_fsdp_optimizer`` write that state into a new ``checkpoint-2``
   (with the run's scheduler, RNG and trainer state files), which our FSDP2 run resumes to step 4.

HF's Trainer under FSDP calls exactly these accelerate functions (``_save_checkpoint`` / ``_load_from_checkpoint``
/ ``_load_optimizer_and_scheduler``); on CPU processes accelerate does not enable FSDP, so they are called here
with minimal stand-ins for the plugin and the accelerator (the attributes these functions read).
"""

import json
import os
import shutil
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import pad_collator, padded_lm_data  # noqa: E402


def _model(seed=42):
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=16, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config)


def _full(model, optimizer=None):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:
        return get_model_state_dict(model, options=options)
    return get_optimizer_state_dict(model, optimizer, options=options)


def _train(out, sdt, resume=None):
    import hf_lightning

    args = hf_lightning.TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4, logging_steps=1,
        save_steps=2, learning_rate=3e-3, weight_decay=0.1, report_to="none", use_cpu=True, disable_tqdm=True,
        seed=42, fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                                         "state_dict_type": f"{sdt}_STATE_DICT"})
    trainer = hf_lightning.Trainer(model=_model(), args=args, train_dataset=padded_lm_data(n=40, seed=1),
                                   data_collator=pad_collator)
    trainer.train(resume_from_checkpoint=resume)
    if resume is None:
        trainer.save_model(os.path.join(out, "final"))  # full weights for from_pretrained, in either layout
    return _full(trainer.model), trainer.state.log_history


def _fresh_sharded(seed):
    """A GPT-2 of other weights, sharded as our run shards it, with AdamW in HF's two groups (decay / no decay)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model(seed)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    no_decay = [p for n, p in model.named_parameters() if "bias" in n or ".ln_" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or ".ln_" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3)
    # As in HF's run, the scheduler exists before the optimizer state is loaded (it adds `initial_lr`).
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer


def _accelerate_stand_ins(sdt):
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig,
                                        ShardedStateDictConfig, StateDictType)

    rank, world = dist.get_rank(), dist.get_world_size()
    if sdt == "FULL":
        plugin = SimpleNamespace(state_dict_type=StateDictType.FULL_STATE_DICT, fsdp_version=2,
                                 state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
                                 optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=True,
                                                                                  rank0_only=True))
    else:
        plugin = SimpleNamespace(state_dict_type=StateDictType.SHARDED_STATE_DICT, fsdp_version=2,
                                 state_dict_config=ShardedStateDictConfig(offload_to_cpu=True),
                                 optim_state_dict_config=ShardedOptimStateDictConfig(offload_to_cpu=True))
    accelerator = SimpleNamespace(process_index=rank, num_processes=world, is_fsdp2=True, is_main_process=rank == 0,
                                  wait_for_everyone=dist.barrier)
    return plugin, accelerator


def _listing(folder):
    return sorted(name + ("/" if os.path.isdir(os.path.join(folder, name)) else "") for name in os.listdir(folder))



def run(work, sdt):
    from accelerate.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    ours = os.path.join(work, sdt, "ours")
    uninterrupted, history = _train(ours, sdt)
    ckpt = os.path.join(ours, "checkpoint-2")
    result = {"files": _listing(ckpt), "dcp_files": {}}
    for name in ("pytorch_model_fsdp_0", "optimizer_0"):
        if os.path.isdir(os.path.join(ckpt, name)):
            result["dcp_files"][name] = _listing(os.path.join(ckpt, name))

    # (2) accelerate's loaders read our folder into a fresh sharded model and optimizer.
    from accelerate import PartialState

    PartialState(cpu=True)  # accelerate's logging needs it (the process group exists already)
    plugin, accelerator = _accelerate_stand_ins(sdt)
    model, optimizer = _fresh_sharded(seed=7)
    load_fsdp_model(plugin, accelerator, model, ckpt)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, ckpt)
    loaded_weights, loaded_optimizer = _full(model), _full(model, optimizer)

    # The same folder read by hf_lightning into another fresh model (the reference for the full state).
    from hf_lightning.checkpointing.model_state import FSDP2ModelState, load_optimizer_files

    ref_model, ref_optimizer = _fresh_sharded(seed=9)
    FSDP2ModelState().load(ref_model, ckpt)
    load_optimizer_files(ref_model, ref_optimizer, ckpt)
    reference_weights, reference_optimizer = _full(ref_model), _full(ref_model, ref_optimizer)

    # (1) accelerate's savers write that state into a new checkpoint-2, which our run resumes.
    theirs = os.path.join(work, sdt, "theirs")
    theirs_ckpt = os.path.join(theirs, "checkpoint-2")
    if rank == 0:
        os.makedirs(theirs_ckpt)
        for name in os.listdir(ckpt):
            if name.startswith(("scheduler", "rng_state", "trainer_state", "training_args", "config")):
                shutil.copy(os.path.join(ckpt, name), theirs_ckpt)
    dist.barrier()
    save_fsdp_model(plugin, accelerator, model, theirs_ckpt)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, theirs_ckpt)
    dist.barrier()
    result["theirs_files"] = _listing(theirs_ckpt)
    resumed, resumed_history = _train(theirs, sdt, resume=theirs_ckpt)

    if rank == 0:
        from transformers import GPT2LMHeadModel

        final = GPT2LMHeadModel.from_pretrained(os.path.join(ours, "final")).state_dict()
        result["from_pretrained_equal"] = sorted(k for k in uninterrupted if torch.equal(final[k], uninterrupted[k]))
        result.update(
            weights_equal_after_resume=sorted(k for k in uninterrupted if torch.equal(uninterrupted[k], resumed[k])),
            weight_names=sorted(uninterrupted),
            accelerate_model_equal=sorted(k for k in reference_weights
                                          if torch.equal(loaded_weights[k], reference_weights[k])),
            # the fresh models' own weights differ from the checkpoint's (so equality means it was loaded)
            fresh_differs=not torch.equal(_model(7).transformer.wte.weight, reference_weights["transformer.wte.weight"]),
            accelerate_optimizer_equal=all(
                torch.equal(torch.as_tensor(value), torch.as_tensor(reference_optimizer["state"][name][key]))
                for name, state in loaded_optimizer["state"].items() for key, value in state.items()),
            optimizer_step=float(loaded_optimizer["state"]["transformer.wte.weight"]["step"]),
            optimizer_groups=[{k: v for k, v in g.items() if k != "params"} for g in loaded_optimizer["param_groups"]],
            loss_at_4=[row["loss"] for row in history if "loss" in row][-1],
            resumed_loss_at_4=[row["loss"] for row in resumed_history if "loss" in row][-1],
        )
    return result


def main():
    work, result_path, *layouts = sys.argv[1:]
    results = {sdt: run(work, sdt) for sdt in layouts}
    if dist.get_rank() == 0:
        with open(result_path, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/helpers/torchrun.run_then_exit: gloo's teardown can deadlock in torch 2.13
