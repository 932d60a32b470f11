"""Tiny models built from configs (nothing downloaded) and small synthetic datasets."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn


class DictDataset(torch.utils.data.Dataset):
    """A plain torch Dataset of feature dicts (not a ``datasets.Dataset``)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


# What each RecordingDataset of this process read, by its name (a script clears it between phases).
READS: dict[str, list[int]] = defaultdict(list)


class RecordingDataset(DictDataset):
    """A :class:`DictDataset` that appends every index it is asked for to ``READS[name]``."""

    def __init__(self, rows: list[dict], name: str):
        super().__init__(rows)
        self.name = name

    def __getitem__(self, i: int) -> dict:
        READS[self.name].append(int(i))
        return super().__getitem__(i)


def lm_data(n_train: int = 64, n_eval: int = 16, seq_len: int = 16, vocab: int = 100, seed: int = 0):
    """The golden run's data: fixed-length token rows with labels = input_ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n_train + n_eval, seq_len), generator=g)
    rows = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]
    return DictDataset(rows[:n_train]), DictDataset(rows[n_train:])


def padded_lm_data(n: int = 37, min_len: int = 5, max_len: int = 16, vocab: int = 96, seed: int = 1):
    """Variable-length rows (python lists) for a padding collator."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(1, vocab, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": list(ids)})
    return DictDataset(rows)


def pad_collator(features: list[dict]) -> dict:
    """Right-pad input_ids with 0 and labels with -100; attention mask marks real tokens."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    labels = torch.full((len(features), longest), -100, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        labels[i, :n] = torch.tensor(f["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tiny_gpt2(vocab: int = 100, n_positions: int = 16, seed: int = 42):
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=n_positions,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def gpt2_dropout():
    """The tiny GPT-2 with GPT2Config's own dropout (0.1 everywhere), seeded with 42."""
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


class NoisyStream(torch.utils.data.IterableDataset):
    """A length-less dataset whose rows draw from the global RNG as they are produced (a streaming transform)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 100, (n, 12), generator=g)

    def __iter__(self):
        for row in self.ids:
            row = row.clone()
            row[0] = int(torch.randint(0, 100, ()))
            yield {"input_ids": row, "labels": row.clone()}


def noisy_collator(features: list[dict]) -> dict:
    """A collator that draws: about a third of the label positions are ignored, chosen by ``torch.rand``."""
    ids = torch.stack([f["input_ids"] for f in features])
    labels = torch.stack([f["labels"] for f in features])
    labels[torch.rand(labels.shape) < 0.3] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def tiny_llama(vocab: int = 96, seed: int = 42):
    from transformers import LlamaConfig, LlamaForCausalLM, set_seed

    set_seed(seed)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config)


def tiny_bert_classifier(num_labels: int = 3, vocab: int = 64, seed: int = 42):
    from transformers import BertConfig, BertForSequenceClassification, set_seed

    set_seed(seed)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=vocab, max_position_embeddings=32, num_labels=num_labels,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def classification_data(n: int = 40, seq_len: int = 12, vocab: int = 64, num_labels: int = 3, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq_len), generator=g)
    labels = torch.randint(0, num_labels, (n,), generator=g)
    return DictDataset([
        {"input_ids": ids[i], "attention_mask": torch.ones(seq_len, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ])


class RegressionModel(nn.Module):
    """An HF-convention model without transformers: keyword inputs, returns ``(loss, preds)`` with labels."""

    def __init__(self, seed: int = 42):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = nn.Linear(4, 1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, labels=None):
        preds = self.lin(self.norm(x)).squeeze(-1)
        if labels is None:
            return (preds,)
        return (nn.functional.mse_loss(preds, labels), preds)


def regression_data(n: int = 24, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(-1) * 0.5 + 0.1 * torch.randn(n, generator=g)
    return DictDataset([{"x": x[i], "labels": y[i]} for i in range(n)])
