"""A one-minute end-to-end run: ``python -m hf_lightning.demo [--output_dir DIR] [--max_steps N]``.

It trains a tiny causal language model on synthetic token sequences through the HF-style
:class:`~hf_lightning.Trainer`, with evaluation, TensorBoard logging, ``checkpoint-N`` saving and rotation, and
needs nothing but hf_lightning's runtime dependencies (no ``transformers``). The sequences follow a learnable rule
(an arithmetic progression modulo the vocabulary, with a random start and stride), so the loss visibly falls.

Example:
    >>> from hf_lightning.demo import main
    >>> summary = main(["--output_dir", "/tmp/demo", "--max_steps", "6"])  # doctest: +SKIP
    >>> summary["checkpoints"]                                              # doctest: +SKIP
    ['checkpoint-4', 'checkpoint-6']
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from hf_lightning.args import TrainingArguments
from hf_lightning.args.parser import HfArgumentParser
from hf_lightning.checkpointing.layout import checkpoint_step
from hf_lightning.trainer import Trainer

__all__ = [
    "DemoArguments",
    "PatternDataset",
    "TinyCausalLM",
    "build_datasets",
    "build_model",
    "build_training_arguments",
    "main",
    "training_kwargs",
]

VOCAB_SIZE = 32
SEQ_LEN = 16
STRIDES = (1, 2, 3)


class TinyCausalLM(nn.Module):
    """A small causal language model with HF's calling convention (no ``transformers`` needed).

    An embedding, one GRU layer (causal by construction: position ``t`` only sees tokens ``<= t``) and a linear
    head. ``forward`` takes keyword tensors and returns a dict with the loss first when labels are given, which is
    all hf_lightning asks of a model.

    Args:
        vocab_size: number of token ids.
        hidden_size: embedding and GRU width.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, hidden_size: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.rnn = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.lm_head = nn.Linear(hidden_size, vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Next-token logits, and the shifted cross-entropy when ``labels`` are given.

        Args:
            input_ids: ``(batch, seq)`` token ids.
            attention_mask: accepted for HF compatibility; the demo's rows are unpadded, so it is not needed.
            labels: ``(batch, seq)`` targets aligned with ``input_ids`` (``-100`` is ignored); position ``t``'s
                logits are scored against ``labels[t + 1]``, as HF's causal-LM models do.

        Returns:
            ``{"loss": scalar, "logits": (batch, seq, vocab)}``, without ``loss`` when no labels are given.
        """
        hidden, _ = self.rnn(self.embed(input_ids))
        logits = self.lm_head(hidden)
        if labels is None:
            return {"logits": logits}
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        return {"loss": loss, "logits": logits}


class PatternDataset(Dataset):
    """Token rows ``(start + stride * t) % vocab_size`` with a random start and stride, and ``labels = input_ids``.

    The first token is unpredictable and the second only partly (the stride is unknown), the rest follow the
    rule: a model that learns it ends far below the ``ln(vocab_size)`` loss of guessing.

    Args:
        num_rows: number of sequences.
        seed: seed of the rows' own generator (the global RNG is left alone).
        seq_len: tokens per row.
        vocab_size: number of token ids.
    """

    def __init__(self, num_rows: int, seed: int = 0, seq_len: int = SEQ_LEN, vocab_size: int = VOCAB_SIZE) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab_size, (num_rows, 1), generator=generator)
        strides = torch.tensor(STRIDES)[torch.randint(0, len(STRIDES), (num_rows, 1), generator=generator)]
        self.input_ids = (starts + strides * torch.arange(seq_len)) % vocab_size

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[index]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@dataclass
class DemoArguments:
    """The demo's command line (every other training setting is fixed by :func:`build_training_arguments`)."""

    output_dir: str = field(default="demo_output", metadata={"help": "Where checkpoints, logs and the model go."})
    max_steps: int = field(default=60, metadata={"help": "Optimizer steps to train for."})
    seed: int = field(default=42, metadata={"help": "Seed for the model's initialisation and the data order."})


def training_kwargs(demo: DemoArguments) -> dict[str, Any]:
    """The demo's ``TrainingArguments`` keywords: log often, evaluate and save three times, keep two checkpoints.

    They are plain HF field names, so ``transformers.TrainingArguments(**training_kwargs(demo))`` describes the
    same run (the demo's tests train it through both).

    Raises:
        ValueError: when ``max_steps`` is not positive.
    """
    if demo.max_steps < 1:
        raise ValueError(f"--max_steps must be a positive number of optimizer steps, got {demo.max_steps}.")
    # Intervals scale with the run so a short one still shows evaluation, saving and rotation.
    every = max(demo.max_steps // 3, 1)
    return dict(
        output_dir=demo.output_dir,
        max_steps=demo.max_steps,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        learning_rate=1e-2,
        warmup_steps=0.1,
        lr_scheduler_type="cosine",
        logging_steps=max(demo.max_steps // 12, 1),
        eval_strategy="steps",
        eval_steps=every,
        save_steps=every,
        save_total_limit=2,
        report_to="tensorboard",
        # HF's PrinterCallback prints each log line; a progress bar would hide them.
        disable_tqdm=True,
        seed=demo.seed,
    )


def build_training_arguments(demo: DemoArguments) -> TrainingArguments:
    """The demo's ``TrainingArguments`` (see :func:`training_kwargs`)."""
    return TrainingArguments(**training_kwargs(demo))


def build_model(seed: int) -> TinyCausalLM:
    """A :class:`TinyCausalLM` whose initial weights depend only on ``seed``."""
    torch.manual_seed(seed)
    return TinyCausalLM()


def build_datasets(seed: int) -> tuple[PatternDataset, PatternDataset]:
    """The demo's ``(train, eval)`` datasets: 512 and 64 rows from different seeds."""
    return PatternDataset(512, seed=seed), PatternDataset(64, seed=seed + 1)


def _checkpoints(output_dir: str) -> list[str]:
    names = [name for name in os.listdir(output_dir) if checkpoint_step(name) is not None]
    return sorted(names, key=checkpoint_step)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the demo and print a summary.

    Args:
        argv: command-line words (``sys.argv[1:]`` when ``None``).

    Returns:
        The summary: ``first_loss`` and ``final_loss`` (logged training losses), ``train_loss`` (the run's
        average), ``eval_loss``, ``perplexity``, ``global_step``, ``checkpoints`` (folders left after rotation)
        and ``output_dir``.
    """
    parser = HfArgumentParser(
        DemoArguments,
        prog="python -m hf_lightning.demo",
        description="Train a tiny causal LM on synthetic data with hf_lightning's HF-style Trainer.",
    )
    (demo,) = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    args = build_training_arguments(demo)

    train_dataset, eval_dataset = build_datasets(demo.seed)
    trainer = Trainer(model=build_model(demo.seed), args=args, train_dataset=train_dataset, eval_dataset=eval_dataset)
    with warnings.catch_warnings():
        # Lightning suggests DataLoader workers; for 16-token rows the main process is faster.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        train_result = trainer.train()
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_metrics("train", train_result.metrics)

        metrics = trainer.evaluate()
    try:
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
    except OverflowError:
        metrics["perplexity"] = float("inf")
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    trainer.save_model()
    trainer.save_state()

    train_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    summary = {
        "first_loss": train_losses[0] if train_losses else float("nan"),
        "final_loss": train_losses[-1] if train_losses else float("nan"),
        "train_loss": train_result.training_loss,
        "eval_loss": metrics["eval_loss"],
        "perplexity": metrics["perplexity"],
        "global_step": train_result.global_step,
        "checkpoints": _checkpoints(args.output_dir),
        "output_dir": args.output_dir,
    }
    print(
        "\n***** demo summary *****\n"
        f"  training loss     {summary['first_loss']:.4f} (first log) -> {summary['final_loss']:.4f} (last log)\n"
        f"  eval loss         {summary['eval_loss']:.4f}\n"
        f"  perplexity        {summary['perplexity']:.3f} (guessing: {VOCAB_SIZE})\n"
        f"  optimizer steps   {summary['global_step']}\n"
        f"  checkpoints left  {', '.join(summary['checkpoints']) or 'none'} (save_total_limit=2)\n"
        f"  output            {os.path.abspath(args.output_dir)}"
    )
    return summary


if __name__ == "__main__":
    main()
