"""Run by test_fsdp_dvclive.py under torchrun, in a DVC repository: FSDP2 training with ``report_to="dvclive"`` and
``HF_DVCLIVE_LOG_MODEL=true``. Rank 0 writes the full weights it ends with to ``<result.pt>``."""

import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.distributed.fsdp_script import _full_weights, _model  # noqa: E402
from tests.helpers.models import pad_collator, padded_lm_data  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402


def main():
    import hf_lightning

    result = sys.argv[1]
    args = hf_lightning.TrainingArguments(
        output_dir="out", per_device_train_batch_size=4, max_steps=2, logging_steps=1, save_strategy="no",
        report_to="dvclive", use_cpu=True, disable_tqdm=True, seed=42,
        fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]},
    )
    trainer = hf_lightning.Trainer(model=_model(), args=args, train_dataset=padded_lm_data(n=16, seed=1),
                                   data_collator=pad_collator)
    trainer.train()
    weights = _full_weights(trainer.model)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(weights, result)
    return trainer


if __name__ == "__main__":
    run_then_exit(main)
