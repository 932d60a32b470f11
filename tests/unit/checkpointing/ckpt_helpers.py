"""Helpers for the checkpoint tests: a tiny GPT-2, its data, an HF Trainer factory, RNG snapshots."""

import torch


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


class TinyLMData(torch.utils.data.Dataset):
    """16 random sequences of 16 tokens, labels = inputs (the golden run's shape)."""

    def __init__(self):
        self.ids = torch.randint(0, 100, (16, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": self.ids[i]}


def hf_trainer(output_dir, model=None, **overrides):
    """A `transformers.Trainer` on the tiny GPT-2, CPU only, no reporting."""
    from transformers import Trainer, TrainingArguments

    values = dict(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=2, save_steps=1, logging_steps=1,
        use_cpu=True, report_to="none", seed=42, disable_tqdm=True,
    )
    values.update(overrides)
    return Trainer(model=model or tiny_gpt2(), args=TrainingArguments(**values), train_dataset=TinyLMData())


def rng_snapshot():
    """The global generator states, read with the plain library calls (not through our code)."""
    import random

    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return random.getstate(), (kind, keys.tolist(), pos, has_gauss, cached), torch.random.get_rng_state().tolist()


def scramble_rng():
    import random

    import numpy as np

    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)
