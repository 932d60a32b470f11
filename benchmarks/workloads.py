"""The models, data and training settings every contender gets, so that only the loop differs.

Two GPT-2 sizes from configs (nothing downloaded), dropout off so each contender does the same arithmetic:

- ``tiny``: 2 layers, width 64, batch 8, sequence 32, 256-token vocabulary. A step costs a few milliseconds, so
  per-step bookkeeping in the loop shows up in the throughput (overhead-bound).
- ``small``: 4 layers, width 256, batch 8, sequence 128, 1024-token vocabulary. A step costs about a second on
  one core, so the loop's own cost is noise next to the matmuls (compute-bound).

Every contender trains with the same optimizer as HF 5.x's default (fused AdamW, lr 5e-5, betas (0.9, 0.999),
eps 1e-8, no weight decay), a linear decay to 0 over ``max_steps`` with no warm-up, and gradient clipping to
norm 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LEARNING_RATE = 5e-5
MAX_GRAD_NORM = 1.0
SEED = 42


@dataclass(frozen=True)
class Workload:
    """One model size and the step counts its timed training runs use.

    Attributes:
        name: ``"tiny"`` or ``"small"``.
        n_layer / n_embd / n_head / vocab / seq_len / batch_size: the GPT-2 config and batch shape.
        warmup_steps: optimizer steps left out of the timed window (start-up, first allocations, lazy init).
        timed_steps: optimizer steps in the timed window; ``max_steps = warmup_steps + timed_steps``.
        logging_steps: logging cadence when logging is on.
        eval_save_steps: evaluation and checkpoint cadence when they are on.
        eval_rows: rows in the evaluation set used during training.
        turn_steps: optimizer steps each contender runs per turn when they take turns (see :mod:`turns`).
    """

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int
    seq_len: int
    batch_size: int
    warmup_steps: int
    timed_steps: int
    logging_steps: int
    eval_save_steps: int
    eval_rows: int
    turn_steps: int

    @property
    def max_steps(self) -> int:
        return self.warmup_steps + self.timed_steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


# The timed window is steps warmup..max_steps. A log/eval/save fired at a step falls between that step's
# timestamp and the next one, so the window holds the same logs, evaluations and saves for every contender:
# tiny 20 logs + 4 eval/saves in 200 steps (10..210); small 2 logs + 2 eval/saves in 20 steps (5..25).
WORKLOADS = {
    "tiny": Workload("tiny", n_layer=2, n_embd=64, n_head=2, vocab=256, seq_len=32, batch_size=8,
                     warmup_steps=10, timed_steps=200, logging_steps=10, eval_save_steps=50, eval_rows=64,
                     turn_steps=10),
    "small": Workload("small", n_layer=4, n_embd=256, n_head=4, vocab=1024, seq_len=128, batch_size=8,
                      warmup_steps=5, timed_steps=20, logging_steps=10, eval_save_steps=10, eval_rows=16,
                      turn_steps=2),
}

# ``--quick``: the same code paths with as little work as possible (for the test; the numbers mean nothing).
QUICK_WORKLOADS = {
    "tiny": Workload("tiny", n_layer=2, n_embd=64, n_head=2, vocab=256, seq_len=32, batch_size=8,
                     warmup_steps=2, timed_steps=4, logging_steps=2, eval_save_steps=2, eval_rows=8,
                     turn_steps=2),
}


def build_model(workload: Workload):
    """A freshly initialised ``GPT2LMHeadModel`` (same weights for every contender: seeded)."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    config = GPT2Config(
        n_layer=workload.n_layer, n_embd=workload.n_embd, n_head=workload.n_head, vocab_size=workload.vocab,
        n_positions=workload.seq_len, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    # HF's Trainer turns the KV cache off for training; the plain contenders must not pay for it either.
    model.config.use_cache = False
    return model


class RowDataset(torch.utils.data.Dataset):
    """Fixed-length token rows as feature dicts (``input_ids``, ``attention_mask``, ``labels``)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self.mask = torch.ones_like(ids[0])

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict:
        row = self.ids[i]
        return {"input_ids": row, "attention_mask": self.mask, "labels": row}


def token_rows(workload: Workload, rows: int, seed: int) -> RowDataset:
    """``rows`` random token sequences (labels = inputs, as causal-LM training does)."""
    generator = torch.Generator().manual_seed(seed)
    return RowDataset(torch.randint(0, workload.vocab, (rows, workload.seq_len), generator=generator))


def train_data(workload: Workload) -> RowDataset:
    """Exactly ``max_steps`` batches: one epoch, so no contender pays for an epoch boundary."""
    return token_rows(workload, workload.max_steps * workload.batch_size, seed=1)


def eval_data(workload: Workload, rows: int | None = None) -> RowDataset:
    return token_rows(workload, rows or workload.eval_rows, seed=2)


def linear_decay(max_steps: int):
    """HF's ``linear`` schedule with no warm-up, as a ``LambdaLR`` factor."""
    return lambda step: max(0.0, (max_steps - step) / max(1, max_steps))
