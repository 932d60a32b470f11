"""Random numbers drawn in HF's order: collators and dataset transforms that draw from the global torch RNG,
interleaved with dropout, against the real ``transformers.Trainer`` (dropout ON, bit-identical).

HF's loader (accelerate's ``DataLoaderShard``) fetches the next micro-batch before it hands out the current one,
and ``get_batch_samples`` pulls a whole accumulation window from it, so window ``k``'s forwards run after the
first micro-batch of window ``k+1`` was loaded and collated. Any draw a collator or a transform makes lands
between dropout's draws at exactly that point; with dropout off these tests would pass whatever the fetch order.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.helpers.models import NoisyStream, gpt2_dropout, noisy_collator
from tests.helpers.parity import run, run_pair
from tests.parity.test_data_parity import SPECIALS, WORDS, tokenized_rows, word_tokenizer

BASE = dict(per_device_train_batch_size=4, logging_steps=1, learning_rate=3e-3, remove_unused_columns=False)


# ---------------------------------------------------------------------------------------------- comparisons
def assert_bit_identical(hf, ours) -> None:
    """Same log_history numbers (exactly), same final weights (bitwise), same checkpoints (bitwise)."""
    assert _strip(ours.log_history) == _strip(hf.log_history)
    assert hf.state_dict.keys() == ours.state_dict.keys()
    for key in hf.state_dict:
        assert torch.equal(hf.state_dict[key], ours.state_dict[key]), f"weight {key}"
    assert hf.checkpoints() == ours.checkpoints()
    for name in hf.checkpoints():
        _assert_checkpoint_weights_equal(f"{hf.output_dir}/{name}", f"{ours.output_dir}/{name}")


def _strip(log_history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second", "model_preparation_time"))}
            for entry in log_history]


def _seeded(call):
    torch.manual_seed(0)
    return call()


def _assert_checkpoint_weights_equal(a: str, b: str) -> None:
    from safetensors.torch import load_file

    wa, wb = load_file(f"{a}/model.safetensors"), load_file(f"{b}/model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{a}: weight {key}"


# ---------------------------------------------------------------------------------------------- (a) MLM
def bert_mlm_dropout():
    from transformers import BertConfig, BertForMaskedLM, set_seed

    set_seed(42)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=len(SPECIALS) + len(WORDS), max_position_embeddings=32,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=0)
    return BertForMaskedLM(config)


def test_masked_lm_with_dropout_and_evaluation(tmp_path):
    """transformers' MLM collator (global RNG), BERT with dropout, GA 2, evaluation every 2 steps: every logged
    loss, every eval_loss, the checkpoints and the final weights are HF's bit for bit."""
    from transformers import DataCollatorForLanguageModeling

    tokenizer = word_tokenizer(with_cls_sep=True)
    from tests.helpers.models import DictDataset

    train = DictDataset(tokenized_rows(tokenizer, 22, seed=4))
    evald = DictDataset(tokenized_rows(tokenizer, 10, seed=5))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.3)
    hf, ours = run_pair(
        bert_mlm_dropout, tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, eval_strategy="steps", eval_steps=2,
                  per_device_eval_batch_size=4, save_steps=3),
        trainer_kwargs=dict(data_collator=collator),
    )
    assert any("eval_loss" in e for e in hf.log_history)
    assert_bit_identical(hf, ours)
    # After training, evaluate() and predict() mask (draw) in the same order too; both start from the same RNG
    # state (the two trainers share the process's global generator).
    hf_eval, ours_eval = (_seeded(t.trainer.evaluate) for t in (hf, ours))
    assert _strip([ours_eval]) == _strip([hf_eval])
    hf_pred, ours_pred = (_seeded(lambda: t.trainer.predict(evald)) for t in (hf, ours))
    assert (ours_pred.predictions == hf_pred.predictions).all()
    assert (ours_pred.label_ids == hf_pred.label_ids).all()
    assert _strip([ours_pred.metrics]) == _strip([hf_pred.metrics])


# ---------------------------------------------------------------------------------------------- (b) transform + collator
def _noisy_tokens(batch: dict) -> dict:
    """A ``datasets`` transform that draws: one token of each row replaced by a random one."""
    ids = torch.tensor(batch["input_ids"])
    ids[:, 0] = torch.randint(0, 100, (ids.shape[0],))
    return {"input_ids": ids, "labels": ids.clone()}


def transformed_dataset(n: int = 20):
    import datasets

    g = torch.Generator().manual_seed(0)
    ds = datasets.Dataset.from_dict({"input_ids": torch.randint(0, 100, (n, 12), generator=g).tolist()})
    ds.set_transform(_noisy_tokens)
    return ds


def _args_b(ga: int, **extra) -> dict:
    return dict(BASE, **{"gradient_accumulation_steps": ga, "num_train_epochs": 2, "save_steps": 1, **extra})


@pytest.mark.parametrize("ga", [1, 3])
def test_random_transform_and_collator_over_an_epoch_boundary(tmp_path, ga):
    """5 micro-batches an epoch, 2 epochs: GA 1 (one micro-batch a step) and GA 3 (windows of 3 and 2)."""
    hf, ours = run_pair(gpt2_dropout, tmp_path, train_dataset=transformed_dataset(),
                        args=_args_b(ga), trainer_kwargs=dict(data_collator=noisy_collator))
    assert hf.train_output.global_step == (10 if ga == 1 else 4)
    assert_bit_identical(hf, ours)


@pytest.mark.parametrize(("ga", "step"), [(1, 3), (3, 1), (3, 2), (1, 5)])
def test_resume_with_random_transform_and_collator(tmp_path, ga, step):
    """Both libraries resume from the same HF checkpoint, mid-epoch ((1, 3), (3, 1)) or at an epoch boundary
    ((3, 2), (1, 5)). HF skips the trained micro-batches by index (no transform or collator draws for them),
    loads the first window after the skip with the fresh process's RNG and only then restores the checkpoint's
    RNG, so its resumed run differs from its uninterrupted one: ours must follow the resumed one."""
    source = run("hf", gpt2_dropout, tmp_path / "source", train_dataset=transformed_dataset(),
                 args=_args_b(ga, save_steps=step), trainer_kwargs=dict(data_collator=noisy_collator))
    results = []
    for kind in ("hf", "ours"):
        out = tmp_path / f"{kind}_resumed"
        out.mkdir()
        shutil.copytree(f"{source.output_dir}/checkpoint-{step}", out / kind / f"checkpoint-{step}")
        results.append(run(kind, gpt2_dropout, out, train_dataset=transformed_dataset(),
                           args=_args_b(ga, save_steps=step),
                           trainer_kwargs=dict(data_collator=noisy_collator), resume=True))
    hf, ours = results
    assert hf.train_output.global_step == source.train_output.global_step
    assert_bit_identical(hf, ours)



# ---------------------------------------------------------------------------------------------- iterable datasets
@pytest.mark.parametrize(("n", "ga"), [(16, 2), (18, 3)])
def test_iterable_dataset_with_random_rows_and_collator(tmp_path, n, ga):
    """A streaming dataset and a collator that both draw, dropout on, several passes over the data. Lightning
    looks one item ahead in a loader without a length, so windows built eagerly would draw for window k+1 before
    window k's dropout. 16 rows, GA 2: 4 micro-batches, the data ends exactly at a window boundary; 18 rows,
    GA 3: 5 micro-batches, the short last window is carried into the next pass (HF's quirk)."""
    args = dict(BASE, gradient_accumulation_steps=ga, max_steps=5, save_steps=2)
    hf, ours = run_pair(gpt2_dropout, tmp_path, train_dataset=NoisyStream(n), args=args,
                        trainer_kwargs=dict(data_collator=noisy_collator))
    assert hf.train_output.global_step == 5
    assert_bit_identical(hf, ours)


def test_resume_iterable_dataset_with_random_rows_and_collator(tmp_path):
    """Both libraries resume from the same HF checkpoint taken mid-pass over a streaming dataset: the trained
    micro-batches are read again and dropped (they draw), then the checkpoint's RNG is restored."""
    args = dict(BASE, gradient_accumulation_steps=2, max_steps=5, save_steps=3)
    source = run("hf", gpt2_dropout, tmp_path / "source", train_dataset=NoisyStream(16), args=args,
                 trainer_kwargs=dict(data_collator=noisy_collator))
    results = []
    for kind in ("hf", "ours"):
        out = tmp_path / f"{kind}_resumed"
        out.mkdir()
        shutil.copytree(f"{source.output_dir}/checkpoint-3", out / kind / "checkpoint-3")
        results.append(run(kind, gpt2_dropout, out, train_dataset=NoisyStream(16), args=args,
                           trainer_kwargs=dict(data_collator=noisy_collator), resume=True))
    hf, ours = results
    assert hf.train_output.global_step == 5
    assert_bit_identical(hf, ours)
