"""Bad input gets a clear error before any optimizer step, with nothing but the empty ``output_dir`` on disk.

Each case builds ``hf_lightning.TrainingArguments`` → ``hf_lightning.Trainer`` → ``train()`` and expects the error
at the stage named in the table. Afterwards: the model's weights are bit-identical to before, an HF-style
recorder saw no ``on_optimizer_step``, and ``output_dir`` holds at most what ``transformers.Trainer`` writes at
construction (measured live, see ``hf_init_files``) — in particular no ``checkpoint-*`` folder.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from tests.helpers.models import DictDataset, RegressionModel, lm_data, regression_data, tiny_gpt2
from tests.helpers.recorder import EventRecorder

BASE_ARGS = dict(report_to="none", use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4,
                 logging_steps=1, save_steps=1, save_strategy="steps")


class DictNoLossModel(nn.Module):
    """Takes labels but never returns a loss: a dict with logits only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        return {"logits": self.lin(x).squeeze(-1)}


class StreamOfRows(torch.utils.data.IterableDataset):
    """An unsized dataset: the number of steps cannot be derived from it."""

    def __iter__(self):
        yield from regression_data(n=8).rows


def _rows_without(dataset: DictDataset, key: str) -> DictDataset:
    return DictDataset([{k: v for k, v in row.items() if k != key} for row in dataset.rows])


@pytest.fixture(scope="module")
def hf_init_files(tmp_path_factory) -> set[str]:
    """What ``transformers.Trainer`` leaves in ``output_dir`` right after a valid construction."""
    import transformers

    out = tmp_path_factory.mktemp("hf_init") / "out"
    args = transformers.TrainingArguments(output_dir=str(out), **BASE_ARGS)
    transformers.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=8))
    return set(os.listdir(out)) if out.exists() else set()


def _snapshot(model: nn.Module | None) -> dict[str, torch.Tensor] | None:
    if model is None:
        return None
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_untouched(output_dir, model, before, recorder, hf_init_files) -> None:
    written = set(os.listdir(output_dir)) if os.path.exists(output_dir) else set()
    assert not [n for n in written if n.startswith("checkpoint-")], written
    assert written <= hf_init_files, f"written beyond HF's init files: {written - hf_init_files}"
    assert not [e for e in recorder.events if e.startswith(("on_optimizer_step", "on_step_end", "on_save"))]
    if model is not None:
        for key, value in model.state_dict().items():
            assert torch.equal(value, before[key]), f"weight {key} changed before the error"


def _make(case: str):
    """(model, model_init, train_dataset, eval_dataset, extra args) for a case, built only for that case."""
    train = regression_data(n=8)
    table = {
        "no_loss": lambda: (DictNoLossModel(), None, train, None, {}),
        "labels_absent_dict": lambda: (tiny_gpt2(), None, _rows_without(lm_data(n_train=8)[0], "labels"), None, {}),
        "labels_absent_tuple": lambda: (RegressionModel(), None, _rows_without(train, "labels"), None, {}),
        "no_usable_columns": lambda: (
            RegressionModel(), None, DictDataset([{"feats": r["x"], "target": r["labels"]} for r in train.rows]),
            None, {}),
        "empty_train": lambda: (RegressionModel(), None, DictDataset([]), None, {}),
        "zero_epochs": lambda: (RegressionModel(), None, train, None, {"num_train_epochs": 0, "max_steps": -1}),
        "iterable_no_max_steps": lambda: (RegressionModel(), None, StreamOfRows(), None, {}),
        "eval_steps_no_eval_dataset": lambda: (RegressionModel(), None, train, None,
                                               {"eval_strategy": "steps", "eval_steps": 2}),
        "eval_epoch_no_eval_dataset": lambda: (RegressionModel(), None, train, None, {"eval_strategy": "epoch"}),
        "best_without_metric": lambda: (RegressionModel(), None, train, regression_data(n=4, seed=9),
                                        {"save_strategy": "best", "eval_strategy": "steps", "eval_steps": 2}),
        "model_and_model_init": lambda: (RegressionModel(), RegressionModel, train, None, {}),
        "neither_model_nor_init": lambda: (None, None, train, None, {}),
        "fp16_on_cpu": lambda: (RegressionModel(), None, train, None, {"fp16": True}),
        "report_to_wandb": lambda: (RegressionModel(), None, train, None, {"report_to": "wandb"}),
        "report_to_unknown": lambda: (RegressionModel(), None, train, None,
                                      {"report_to": ["tensorboard", "no_such_logger"]}),
    }
    return table[case]()


# (case, stage the error must come at, exception type, message pattern)
TRAINER_ERRORS = [
    ("no_loss", "train", ValueError,
     r"did not return a loss.*only the following keys: logits\..*inputs it received are x,labels"),
    ("labels_absent_dict", "train", ValueError,
     r"did not return a loss.*only the following keys: logits\..*inputs it received are "
     r"input_ids,attention_mask\..*label"),
    ("labels_absent_tuple", "train", ValueError,
     r"first element is not a scalar loss.*inputs it received are x\b.*(loss first|compute_loss_func)"),
    ("no_usable_columns", "train", ValueError,
     r"batch received was empty.*\bx\b.*\blabels\b"),
    ("empty_train", "train", ValueError, r"train_dataset is empty \(0 rows\)"),
    ("zero_epochs", "train", ValueError, r"num_train_epochs=0 and max_steps=-1.*`num_train_epochs` > 0"),
    ("iterable_no_max_steps", "init", ValueError, r"does not implement __len__, max_steps has to be specified"),
    ("eval_steps_no_eval_dataset", "init", ValueError,
     r"`args.eval_strategy` to IntervalStrategy.STEPS but you didn't pass an `eval_dataset`"),
    ("eval_epoch_no_eval_dataset", "init", ValueError,
     r"`args.eval_strategy` to IntervalStrategy.EPOCH but you didn't pass an `eval_dataset`"),
    ("best_without_metric", "init", ValueError,
     r"`args.metric_for_best_model` must be provided when using 'best' save_strategy"),
    ("model_and_model_init", "init", RuntimeError, r"either a `model` or `model_init` argument, but not both"),
    ("neither_model_nor_init", "init", RuntimeError, r"requires either a `model` or `model_init` argument\.$"),
    ("fp16_on_cpu", "train", ValueError, r"fp16=True needs a CUDA GPU.*bf16=True"),
    ("report_to_wandb", "init", ValueError,
     r"report_to contains 'wandb', but its package is not installed\. Run `pip install wandb`"),
    ("report_to_unknown", "init", ValueError,
     r"report_to='no_such_logger' is not supported by hf_lightning \(nor by HF\)\. Supported: \['azure_ml', "
     r"'clearml', 'codecarbon', 'comet_ml', 'csv', 'dagshub', 'dvclive', 'flyte', 'kubeflow', 'mlflow', 'neptune', "
     r"'swanlab', 'tensorboard', 'trackio', 'wandb'\]"),
]

_XFAIL: dict[str, str] = {}


def _params(table):
    return [pytest.param(*row, id=row[0],
                         marks=[pytest.mark.xfail(strict=True, reason=_XFAIL[row[0]])] if row[0] in _XFAIL else [])
            for row in table]


@pytest.mark.parametrize("case,stage,exc,pattern", _params(TRAINER_ERRORS))
def test_bad_input_fails_before_any_step(tmp_path, hf_init_files, case, stage, exc, pattern):
    import hf_lightning

    model, model_init, train, evald, extra = _make(case)
    before = _snapshot(model)
    output_dir = str(tmp_path / "out")
    recorder = EventRecorder()
    args = hf_lightning.TrainingArguments(output_dir=output_dir, **{**BASE_ARGS, **extra})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stage == "init":
            with pytest.raises(exc, match=pattern):
                hf_lightning.Trainer(model=model, model_init=model_init, args=args, train_dataset=train,
                                     eval_dataset=evald, callbacks=[recorder])
        else:
            trainer = hf_lightning.Trainer(model=model, model_init=model_init, args=args, train_dataset=train,
                                           eval_dataset=evald, callbacks=[recorder])
            with pytest.raises(exc, match=pattern):
                trainer.train()
    _assert_untouched(output_dir, model, before, recorder, hf_init_files)


# Invalid argument values are refused by TrainingArguments itself, with the valid choices in the message.
ARGS_ERRORS = [
    ({"optim": "adamw_bogus"}, r"optim: 'adamw_bogus' is not a valid OptimizerNames, please select one of "
                               r"\[.*'adamw_torch'.*'adafactor'.*'sgd'"),
    ({"lr_scheduler_type": "cosine_bogus"},
     r"lr_scheduler_type: 'cosine_bogus' is not a valid SchedulerType, please select one of "
     r"\['linear', 'cosine', 'cosine_with_restarts'.*'warmup_stable_decay'"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "epoch"},
     r"--load_best_model_at_end requires the save and eval strategy to match, except when "
     r"--save_strategy=\"best\", but found\n- Evaluation strategy: IntervalStrategy.STEPS\n"
     r"- Save strategy: SaveStrategy.EPOCH"),
    ({"load_best_model_at_end": True, "eval_strategy": "no", "save_strategy": "steps"},
     r"(?s)requires the save and eval strategy to match.*Evaluation strategy: IntervalStrategy.NO"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 2, "save_steps": 5},
     r"requires the saving steps to be a round multiple of the evaluation steps, but found 5, which is not a "
     r"round multiple of 2"),
]


@pytest.mark.parametrize("extra,pattern", ARGS_ERRORS, ids=["optim", "lr_scheduler_type", "lbmae_steps_vs_epoch",
                                                            "lbmae_eval_no", "lbmae_steps_not_multiple"])
def test_invalid_arguments_refused_at_construction(tmp_path, extra, pattern):
    import transformers

    import hf_lightning

    output_dir = tmp_path / "out"
    base = dict(output_dir=str(output_dir), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match=pattern):
        hf_lightning.TrainingArguments(**base, **extra)
    # HF refuses the same arguments at the same point.
    with pytest.raises(ValueError):
        transformers.TrainingArguments(**base, **extra)
    assert not output_dir.exists()


def test_hf_writes_nothing_but_the_folder_at_init(hf_init_files):
    """The baseline the cases above compare with: HF creates ``output_dir`` and leaves it empty."""
    assert hf_init_files == set()
