"""The resolved training plan: HF's step accounting turned into absolute optimizer-step counts.

Everything that needs "how many steps" reads a :class:`TrainingPlan`; nothing else re-derives it. The rules are
HF 5.x's ``Trainer.set_initial_training_values`` (reference §1.2): a partial last accumulation window counts as a
full optimizer step, fractional epochs round the step count up, and an unsized dataset needs ``max_steps``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingPlan:
    """Step counts for one ``train()`` call, in optimizer steps (never micro-batches).

    Attributes:
        micro_batches_per_epoch: ``L``, batches one process sees per epoch, or ``None`` for an unsized dataset.
        steps_in_epoch: the micro-batch count HF divides by for ``state.epoch`` (``L``, or ``max_steps * GA``
            when the dataset is unsized).
        update_steps_per_epoch: ``nupe = ceil(L / GA)`` (``max_steps`` when unsized).
        max_steps: total optimizer steps of the run.
        num_train_epochs: loop epochs (``sys.maxsize`` when unsized).
        gradient_accumulation_steps: ``GA``.
        num_train_samples: samples HF's speed metrics count for the whole schedule.
        total_train_batch_size: ``train_batch_size * GA * world_size``.
    """

    micro_batches_per_epoch: int | None
    steps_in_epoch: int
    update_steps_per_epoch: int
    max_steps: int
    num_train_epochs: int
    gradient_accumulation_steps: int
    num_train_samples: float
    total_train_batch_size: int

    def epoch_progress(self, epoch: int, micro_batches_done: int) -> float:
        """HF's ``state.epoch`` after ``micro_batches_done`` batches of loop epoch ``epoch``."""
        return epoch + micro_batches_done / self.steps_in_epoch


def resolve_plan(args, micro_batches_per_epoch: int | None, num_examples: int | None = None,
                 world_size: int = 1) -> TrainingPlan:
    """Resolve HF's step accounting for a run.

    Args:
        args: a ``TrainingArguments``-like object (reads ``max_steps``, ``num_train_epochs``,
            ``gradient_accumulation_steps``, ``per_device_train_batch_size``).
        micro_batches_per_epoch: ``len(train_dataloader)`` on this process, or ``None`` when unsized.
        num_examples: ``len(train_dataset)`` when sized (for the speed metrics).
        world_size: data-parallel processes.

    Raises:
        ValueError: when neither a positive ``max_steps`` nor a sized dataset gives a step count, or the
            dataset yields no batch.
    """
    ga = int(args.gradient_accumulation_steps)
    if ga < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got {ga}.")
    train_batch_size = int(args.train_batch_size)
    total_train_batch_size = train_batch_size * ga * world_size
    max_steps_arg = int(args.max_steps)

    if micro_batches_per_epoch is None:
        if max_steps_arg <= 0:
            raise ValueError(
                "The train dataset does not implement __len__, so the number of training steps is unknown: set "
                "`max_steps` (TrainingArguments.max_steps) to a positive number of optimizer steps."
            )
        return TrainingPlan(
            micro_batches_per_epoch=None,
            steps_in_epoch=max_steps_arg * ga,
            update_steps_per_epoch=max_steps_arg,
            max_steps=max_steps_arg,
            num_train_epochs=sys.maxsize,
            gradient_accumulation_steps=ga,
            num_train_samples=max_steps_arg * total_train_batch_size,
            total_train_batch_size=total_train_batch_size,
        )

    if micro_batches_per_epoch <= 0:
        raise ValueError(
            "The train dataloader is empty (0 batches per epoch): the train dataset has no rows, or "
            "`dataloader_drop_last=True` dropped its only, incomplete batch. Provide more training data or a "
            "smaller `per_device_train_batch_size`."
        )
    nupe = max(math.ceil(micro_batches_per_epoch / ga), 1)
    if max_steps_arg > 0:
        max_steps = max_steps_arg
        num_train_epochs = math.ceil(max_steps / nupe)
        num_train_samples = max_steps * total_train_batch_size
    else:
        if args.num_train_epochs <= 0:
            raise ValueError(
                f"Nothing to train: num_train_epochs={args.num_train_epochs} and max_steps={args.max_steps}. Set "
                "`num_train_epochs` > 0 or `max_steps` > 0."
            )
        max_steps = math.ceil(args.num_train_epochs * nupe)
        num_train_epochs = math.ceil(args.num_train_epochs)
        num_train_samples = (num_examples if num_examples is not None else 0) * args.num_train_epochs
    return TrainingPlan(
        micro_batches_per_epoch=micro_batches_per_epoch,
        steps_in_epoch=micro_batches_per_epoch,
        update_steps_per_epoch=nupe,
        max_steps=max_steps,
        num_train_epochs=num_train_epochs,
        gradient_accumulation_steps=ga,
        num_train_samples=num_train_samples,
        total_train_batch_size=total_train_batch_size,
    )
