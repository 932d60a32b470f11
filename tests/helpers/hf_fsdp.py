"""transformers' own FSDP2 run on CPU processes, for tests and benchmarks that compare against it.

Out of the box, accelerate turns FSDP on only for GPU-family devices: given an FSDP plugin on CPU processes (gloo),
``AcceleratorState`` stays ``MULTI_CPU`` and transformers' Trainer trains with DDP instead. :func:`accelerate_fsdp_on_cpu`
lifts that one gate, so transformers and accelerate then run the code they run on GPUs (``fsdp2_prepare_model``:
``fully_shard`` on each wrapped layer, then the root; the DTensor-aware clipping; the FSDP checkpoint functions).
Call it in the process before the ``TrainingArguments`` / ``Trainer`` are built. hf_lightning never needs it.
"""

from __future__ import annotations

__all__ = ["accelerate_fsdp_on_cpu"]


def accelerate_fsdp_on_cpu() -> None:
    """Make accelerate set up FSDP on CPU processes as it does on GPUs (in this process; idempotent).

    After accelerate's own ``AcceleratorState`` set-up, when an FSDP plugin was given and the state is
    ``MULTI_CPU``, this sets the FSDP type and plugin accelerate would have set on a GPU, on the accelerator state and
    on the process state (which ``AcceleratorState`` copies its fields from whenever it is built again).
    """
    import accelerate.state
    from accelerate.utils import DistributedType

    state_class = accelerate.state.AcceleratorState
    if getattr(state_class.__init__, "_fsdp_on_cpu", False):
        return
    original = state_class.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            accelerate.state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    init._fsdp_on_cpu = True
    state_class.__init__ = init
