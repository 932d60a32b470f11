"""``LightningCLI`` for HF models: :class:`HFLightningCLI` and the factories a YAML config names.

Lightning users launch runs with ``LightningCLI`` and a YAML file. :class:`HFLightningCLI` is Lightning's CLI with
``HFLightningModule`` as the model and ``HFDataModule`` as the data, plus one ``training_args:`` section (HF's
``TrainingArguments``) that is given once and handed to both. The model inside ``HFLightningModule`` and the datasets
inside ``HFDataModule`` are named in the YAML by ``class_path``:

- :func:`model_from_config` builds an HF model from a config dict (``AutoConfig.for_model`` + ``from_config``);
- :func:`model_from_pretrained` loads one from a local ``save_pretrained`` folder;
- :class:`TextFileDataset` cuts a text file into fixed-length blocks of token ids for causal-LM training.

``transformers`` is imported inside the model factories only; ``jsonargparse`` (Lightning's optional CLI
dependency) only when :class:`HFLightningCLI` is built. See ``examples/lightning_cli.py`` and its YAML.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.callbacks.hf_api import TrainerCallback
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.module import HFLightningModule
from hf_lightning.seed import enable_full_determinism, set_seed

# The head each task puts on the model: task name -> the `transformers` auto class that builds it.
TASK_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
}

# The `lightning.Trainer` defaults the CLI changes (HFLightningModule derives or refuses the rest, see
# `lightning_settings.py`): HF saves `checkpoint-N` folders itself, so no default `ModelCheckpoint` (the module refuses
# one); the run's length comes from `training_args` when `fit` starts, so no epoch limit until then (Lightning would
# warn that it picks 1000); and no model summary, which HF's Trainer does not print. A YAML `trainer:` section can
# still set any Trainer argument.
CLI_TRAINER_DEFAULTS: dict[str, Any] = {
    "enable_checkpointing": False,
    "max_epochs": -1,
    "enable_model_summary": False,
}

# Constructor arguments that are the HF-style facade's plumbing (or live objects a config cannot describe), kept
# out of the CLI's `model:` / `data:` sections: the module binds its model to the datamodule itself. The module's
# `callbacks` (an untyped list) is added back with its element type, so `class_path` entries are instantiated.
_NOT_CONFIGURABLE = {
    "model": {"hooks", "hooks_call_hf_training_step", "loss_is_scaled_for_ga", "label_smoother", "optimizers", "seed",
              "callbacks"},
    "data": {"model"},
}


def _auto_class(task: str) -> Any:
    """The ``transformers`` auto class for ``task``, with clear errors before any import work is wasted."""
    if task not in TASK_AUTO_CLASSES:
        raise ValueError(f"Unknown task {task!r} for the model: use one of {sorted(TASK_AUTO_CLASSES)}.")
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "Building an HF model from a config or a folder needs `transformers`, which is not installed: "
            "pip install transformers (hf_lightning itself does not need it)."
        ) from None
    return getattr(transformers, TASK_AUTO_CLASSES[task])


def model_from_config(model_type: str, task: str = "causal-lm", config: dict[str, Any] | None = None) -> torch.nn.Module:
    """A freshly initialised HF model built from a config dict (nothing is downloaded).

    Args:
        model_type: the ``transformers`` model type, e.g. ``"gpt2"`` or ``"bert"``.
        task: the head: one of :data:`TASK_AUTO_CLASSES` (``"causal-lm"``, ``"sequence-classification"``, ...).
        config: config values that replace the model type's defaults, e.g. ``{"n_layer": 2, "vocab_size": 256}``.

    Returns:
        The model (``AutoModelFor<task>.from_config``), its weights drawn from the global RNG: seed first.

    Raises:
        ValueError: ``task`` or ``model_type`` is unknown.
        ImportError: ``transformers`` is not installed.
    """
    auto = _auto_class(task)
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.for_model(model_type, **(config or {}))
    except ValueError as err:
        raise ValueError(
            f"model_from_config: unknown model_type {model_type!r} ({err}). Use a `transformers` model type such as "
            "'gpt2' or 'bert'."
        ) from None
    return auto.from_config(hf_config)


def model_from_pretrained(path: str, task: str = "causal-lm", config: dict[str, Any] | None = None) -> torch.nn.Module:
    """An HF model loaded from a local folder written by ``save_pretrained`` (or a ``checkpoint-N`` folder).

    Args:
        path: the folder (``config.json`` and the weights). Hub names are refused: nothing is downloaded.
        task: the head: one of :data:`TASK_AUTO_CLASSES`.
        config: config values that replace the saved ones (``from_pretrained``'s keyword arguments).

    Returns:
        The model (``AutoModelFor<task>.from_pretrained(path)``).

    Raises:
        ValueError: ``task`` is unknown, or ``path`` is not a folder with a ``config.json``.
        ImportError: ``transformers`` is not installed.
    """
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"model_from_pretrained: {path!r} is not a folder with a config.json. Give a local folder written by "
            "save_pretrained (runs here are offline, a Hub name is not downloaded), or use model_from_config."
        )
    return _auto_class(task).from_pretrained(path, **(config or {}))


class TextFileDataset(torch.utils.data.Dataset):
    """A text file cut into blocks of ``block_size`` token ids, for causal-LM training (HF's ``run_clm`` grouping).

    The whole file is tokenized, the ids concatenated and cut into consecutive blocks; the last, shorter block is
    dropped. Each item is ``{"input_ids": ids, "labels": ids}`` (the model shifts the labels).

    Args:
        path: the text file.
        block_size: tokens per item.
        tokenizer: a local tokenizer folder (``AutoTokenizer.from_pretrained``, needs ``transformers``). Without one,
            the UTF-8 bytes are the ids (a vocabulary of 256: set the model's ``vocab_size`` to 256).

    Raises:
        ValueError: the file does not exist, or is too short for one block.
    """

    def __init__(self, path: str, block_size: int = 64, tokenizer: str | None = None) -> None:
        if not os.path.isfile(path):
            raise ValueError(f"TextFileDataset: no file at {path!r}.")
        if block_size < 1:
            raise ValueError(f"TextFileDataset: block_size must be at least 1, got {block_size}.")
        text = Path(path).read_text(encoding="utf-8")
        if tokenizer is None:
            ids = list(text.encode("utf-8"))
        else:
            from transformers import AutoTokenizer

            ids = AutoTokenizer.from_pretrained(tokenizer)(text)["input_ids"]
        blocks = len(ids) // block_size
        if blocks == 0:
            raise ValueError(
                f"TextFileDataset: {path!r} has {len(ids)} tokens, fewer than one block of {block_size}; lower "
                "block_size."
            )
        self.blocks = torch.tensor(ids[: blocks * block_size], dtype=torch.long).view(blocks, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index].clone()}


class HFLightningCLI(LightningCLI):
    """``LightningCLI`` for ``HFLightningModule`` + ``HFDataModule`` with one shared ``TrainingArguments``.

    The YAML (or command line) has Lightning's sections (``trainer:``, ``model:``, ``data:``) and one more,
    ``training_args:``, HF's ``TrainingArguments`` fields. They are parsed into one ``TrainingArguments`` that is
    passed to the module and the datamodule as their ``args`` (so ``model:`` and ``data:`` do not repeat it).
    What else differs from a plain ``LightningCLI``:

    - seeding is HF's: ``set_seed(training_args.seed)`` (``enable_full_determinism`` with
      ``full_determinism``) before the model is built, as HF's example scripts do; Lightning's
      ``seed_everything`` is off, and giving it is an error (set ``training_args.seed``);
    - no ``optimizer:`` / ``lr_scheduler:`` sections: the optimizer and schedule come from ``training_args``
      (``optim``, ``learning_rate``, ``lr_scheduler_type``, ...), as in HF;
    - the ``trainer:`` defaults in :data:`CLI_TRAINER_DEFAULTS`, ``default_root_dir`` = ``output_dir``, the
      loggers named by ``report_to`` when ``trainer.logger`` is not given, and HF's autocast scope for ``bf16`` /
      ``fp16`` when neither ``trainer.precision`` nor ``trainer.plugins`` is;
    - the resolved config is saved as ``config.yaml`` in the run's log folder, overwritten on a resume.

    Args:
        model_class: the module class (``HFLightningModule`` or a subclass).
        datamodule_class: the datamodule class (``HFDataModule`` or a subclass).
        trainer_defaults: ``lightning.Trainer`` defaults on top of :data:`CLI_TRAINER_DEFAULTS`.
        **kwargs: any other ``LightningCLI`` argument (``args=``, ``run=``, ``trainer_class=``, ...) except
            ``subclass_mode_model`` / ``subclass_mode_data``: pass the subclass itself as ``model_class`` /
            ``datamodule_class``.

    Raises:
        ModuleNotFoundError: ``jsonargparse`` is not installed (``pip install "jsonargparse[signatures]"``).
        ValueError: ``subclass_mode_model`` or ``subclass_mode_data`` is set.
    """

    def __init__(
        self,
        model_class: type[HFLightningModule] | Callable[..., HFLightningModule] = HFLightningModule,
        datamodule_class: type[HFDataModule] | Callable[..., HFDataModule] = HFDataModule,
        *,
        trainer_defaults: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if importlib.util.find_spec("jsonargparse") is None:
            raise ModuleNotFoundError(
                "HFLightningCLI needs `jsonargparse`, Lightning's optional CLI dependency: "
                'pip install "jsonargparse[signatures]" (or lightning[pytorch-extra]).'
            )
        modes = [name for name in ("subclass_mode_model", "subclass_mode_data") if kwargs.get(name)]
        if modes:
            raise ValueError(
                f"HFLightningCLI does not support {' / '.join(modes)}=True: the training_args section is handed to the "
                "class's `args`, which jsonargparse cannot do for a class chosen in the config. Pass your subclass "
                "instead: HFLightningCLI(model_class=MyModule, datamodule_class=MyDataModule)."
            )
        kwargs.setdefault("seed_everything_default", False)
        kwargs.setdefault("auto_configure_optimizers", False)
        save_config_kwargs = {"overwrite": True, **(kwargs.pop("save_config_kwargs", None) or {})}
        super().__init__(
            model_class,
            datamodule_class,
            trainer_defaults={**CLI_TRAINER_DEFAULTS, **(trainer_defaults or {})},
            save_config_kwargs=save_config_kwargs,
            **kwargs,
        )

    def add_core_arguments_to_parser(self, parser: Any) -> None:
        """Lightning's ``trainer:``, ``model:`` and ``data:`` sections, without the facade-only arguments."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        for key, cls in (("model", self.model_class), ("data", self.datamodule_class)):
            parser.add_class_arguments(cls, key, fail_untyped=False, instantiate=True, sub_configs=True,
                                       skip=_NOT_CONFIGURABLE[key])
        parser.add_argument("--model.callbacks", type=Optional[list[TrainerCallback]], default=None,
                            help="HF-style TrainerCallbacks (class_path + init_args), driven in HF's event order.")

    def add_arguments_to_parser(self, parser: Any) -> None:
        """Add the ``training_args:`` section and hand the one ``TrainingArguments`` to the module and the data."""
        parser.add_class_arguments(TrainingArguments, "training_args")
        parser.link_arguments("training_args", "model.args", apply_on="instantiate")
        parser.link_arguments("training_args", "data.args", apply_on="instantiate")
        parser.link_arguments("training_args.output_dir", "trainer.default_root_dir")

    def before_instantiate_classes(self) -> None:
        """Seed as HF's example scripts do (before the model is built), from ``training_args``."""
        config = self.config.get(str(self.subcommand), self.config)
        if config.get("seed_everything") not in (False, None):
            raise ValueError(
                "HFLightningCLI seeds from training_args.seed (HF's seed: model init, data order, dropout); remove "
                "seed_everything and set training_args.seed instead."
            )
        args = config.training_args
        if args.full_determinism:
            enable_full_determinism(args.seed)
        else:
            set_seed(args.seed)

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """Lightning's trainer, with what ``training_args`` imply where the ``trainer:`` section is silent: the
        ``report_to`` loggers, and for ``bf16`` / ``fp16`` HF's autocast scope (``HFMixedPrecision``, the model's
        forward only)."""
        from hf_lightning.loggers import build_loggers
        from hf_lightning.precision import HFMixedPrecision
        from hf_lightning.trainer.build import resolve_precision
        from hf_lightning.trainer.strategies import cpu_run

        trainer = self.config_init.get(str(self.subcommand), self.config_init).trainer
        args = self.model.args
        if trainer.get("logger") is None and "logger" not in kwargs:
            kwargs["logger"] = build_loggers(args) or False
        precision = resolve_precision(args)
        if precision != "32-true" and trainer.get("precision") is None and not trainer.get("plugins") \
                and "plugins" not in kwargs:
            device = "cpu" if trainer.get("accelerator") == "cpu" or cpu_run(args) else "cuda"
            kwargs["plugins"] = [HFMixedPrecision(precision, device)]
        return super().instantiate_trainer(**kwargs)
