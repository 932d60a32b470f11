"""``HFDataModule``: HF's Trainer data pipeline as a ``LightningDataModule``.

It reproduces what ``Trainer.get_train_dataloader`` / ``get_eval_dataloader`` / ``get_test_dataloader`` build
(reference §11): the default collator choice, ``remove_unused_columns``, HF's seeded shuffle (same order for the
same seed / ``data_seed``), length grouping, and the dataloader options — and hands Lightning the train loader as
gradient-accumulation windows (:class:`~hf_lightning.data.windows.WindowedLoader`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from hf_lightning._utils import enum_value, has_len, unwrap_model
from hf_lightning.args.parallelism import data_parallel_layout
from hf_lightning.data.collators import DataCollatorWithPadding, default_data_collator
from hf_lightning.data.columns import RemoveColumnsCollator, remove_unused_columns, signature_columns
from hf_lightning.data.dispatch import DispatchedLoader, IterableShard, broadcast_from_first
from hf_lightning.data.samplers import (
    EvalShardBatchSampler,
    LengthGroupedSampler,
    SeedableRandomSampler,
    ShardedBatchSampler,
)
from hf_lightning.data.windows import WindowedLoader, load_window

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


def _is_hf_dataset(dataset: Any) -> bool:
    return hasattr(dataset, "column_names") and hasattr(dataset, "remove_columns")


def _seed_worker(worker_id: int, num_workers: int = 0, rank: int = 0) -> None:
    # HF seeds each worker from the loader's base seed so workers differ but runs repeat.
    seed = (num_workers * rank + torch.initial_seed()) % 2**32
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class HFDataModule(pl.LightningDataModule):
    """Datasets, collator, samplers and dataloaders as HF's Trainer builds them.

    Args:
        args: a ``TrainingArguments``.
        train_dataset: map-style or iterable dataset of feature dicts (a ``datasets.Dataset`` works too).
        eval_dataset: a dataset, or a dict ``name -> dataset`` (metrics become ``eval_<name>_*``).
        test_dataset: the dataset ``predict()`` runs on.
        data_collator: turns a list of features into a batch; defaults as HF (padding through
            ``processing_class`` when it can pad, else ``default_data_collator``).
        processing_class: a tokenizer / processor (used by the default collator and saved with checkpoints).
        model: the model whose ``forward`` signature decides ``remove_unused_columns`` (bound automatically by
            ``HFLightningModule`` when omitted).
    """

    def __init__(
        self,
        args: TrainingArguments,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | Mapping[str, Dataset] | None = None,
        test_dataset: Dataset | None = None,
        data_collator: Callable | None = None,
        processing_class: Any = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.args = args
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.test_dataset = test_dataset
        self.processing_class = processing_class
        if data_collator is None:
            can_pad = processing_class is not None and hasattr(processing_class, "pad")
            data_collator = DataCollatorWithPadding(processing_class) if can_pad else default_data_collator
        self.data_collator = data_collator
        self.model = model
        self.label_names: list[str] | None = list(args.label_names) if args.label_names else None
        self._train_loader: DataLoader | None = None
        self._signature: list[str] | None = None
        self._skip_windows = 0
        self._train_sampler_fn: Callable[[Any], Any] | None = None
        self._eval_sampler_fn: Callable[[Any], Any] | None = None
        self._keep_columns: Callable[[], list[str]] | None = None
        self._filter_dataset: Callable[[Any, str], Any] | None = None
        self._wrap_collator: Callable[[Callable, str], Callable] | None = None

    # ------------------------------------------------------------------ model binding / columns
    def bind_model(self, model: torch.nn.Module, label_names: list[str] | None = None) -> None:
        """Give the datamodule the model whose forward signature filters the columns (if none was given)."""
        if self.model is None:
            self.model = model
        if self.label_names is None and label_names is not None:
            self.label_names = list(label_names)
        self._signature = None

    def set_column_rules(self, keep: Callable[[], list[str]] | None = None,
                         filter_dataset: Callable[[Any, str], Any] | None = None,
                         wrap_collator: Callable[[Callable, str], Callable] | None = None) -> None:
        """Filter columns with other rules than HF's defaults (the facade passes a subclass's overrides).

        Args:
            keep: ``keep()`` → the column names to keep (HF's ``_signature_columns``).
            filter_dataset: ``filter_dataset(dataset, description)`` → a ``datasets.Dataset`` without the unused
                columns (HF's ``_remove_unused_columns``); it also decides whether to filter at all.
            wrap_collator: ``wrap_collator(collator, description)`` → the collator for other datasets (HF's
                ``_get_collator_with_removed_columns``).
        """
        self._keep_columns, self._filter_dataset, self._wrap_collator = keep, filter_dataset, wrap_collator

    def _signature_columns(self) -> list[str] | None:
        if self._keep_columns is not None:
            return self._keep_columns()
        if self.model is None:
            return None
        if self._signature is None:
            self._signature = signature_columns(unwrap_model(self.model), self.label_names)
        return self._signature

    def _prepare(self, dataset: Any, description: str) -> tuple[Any, Callable]:
        """Apply ``remove_unused_columns`` to a dataset; returns it with the collator to use."""
        collator = self.data_collator
        if _is_hf_dataset(dataset) and self._filter_dataset is not None:
            return self._filter_dataset(dataset, description), collator
        if not _is_hf_dataset(dataset) and self._wrap_collator is not None:
            return dataset, self._wrap_collator(collator, description)
        if not self.args.remove_unused_columns:
            return dataset, collator
        columns = self._signature_columns()
        if columns is None:
            return dataset, collator
        if _is_hf_dataset(dataset):
            return remove_unused_columns(dataset, columns, description=description), collator
        return dataset, RemoveColumnsCollator(collator, columns, description=description)

    # ------------------------------------------------------------------ train
    def _loader_kwargs(self) -> dict[str, Any]:
        args = self.args
        workers = int(args.dataloader_num_workers or 0)
        pin = bool(args.dataloader_pin_memory) and torch.cuda.is_available() and not getattr(
            args, "use_cpu", False
        )
        kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": pin}
        if workers > 0:
            kwargs["persistent_workers"] = bool(args.dataloader_persistent_workers)
            prefetch = args.dataloader_prefetch_factor
            if prefetch is not None:
                kwargs["prefetch_factor"] = prefetch
        return kwargs

    def default_train_sampler(self, dataset: Any):
        """The sampler HF builds for ``train_sampling_strategy`` (``None`` for an iterable dataset)."""
        if isinstance(dataset, IterableDataset) or not has_len(dataset):
            return None
        args = self.args
        strategy = enum_value(args.train_sampling_strategy)
        if strategy not in ("random", "sequential", "group_by_length"):
            raise ValueError(
                f"train_sampling_strategy={strategy!r} is not supported by hf_lightning; use 'random', "
                "'sequential' or 'group_by_length'."
            )
        if strategy == "sequential":
            return SequentialSampler(dataset)
        if strategy == "group_by_length":
            lengths = None
            column = args.length_column_name
            if _is_hf_dataset(dataset) and column in dataset.column_names:
                lengths = dataset[column]
            model_input_name = getattr(self.processing_class, "model_input_names", ["input_ids"])[0] \
                if self.processing_class is not None else None
            return LengthGroupedSampler(
                args.train_batch_size * args.gradient_accumulation_steps,
                dataset=dataset,
                lengths=lengths,
                model_input_name=model_input_name,
            )
        # HF (through accelerate) seeds the shuffle with data_seed, else the torch seed in force when the train
        # loader is prepared: args.seed after the Trainer's set_seed, unless model_init reseeded.
        seed = args.data_seed if args.data_seed is not None else torch.initial_seed()
        return SeedableRandomSampler(dataset, seed)

    def set_train_loader(self, loader: Any) -> None:
        """Train on ``loader`` (per-micro-batch batches) instead of the one built from ``train_dataset``.

        The facade passes the loader of a ``get_train_dataloader`` override here; it is cut into windows as the
        built one would be.
        """
        self._train_loader = loader

    def set_sampler_factories(self, train: Callable[[Any], Any] | None = None,
                              eval: Callable[[Any], Any] | None = None) -> None:
        """Build the train / eval samplers with ``train(dataset)`` / ``eval(dataset)`` instead of HF's defaults.

        The facade passes a subclass's ``_get_train_sampler`` / ``_get_eval_sampler`` here. A plain
        ``RandomSampler`` from ``train`` is replaced by the seeded shuffle, as accelerate replaces it in HF.
        """
        self._train_sampler_fn, self._eval_sampler_fn = train, eval

    def skip_first_windows(self, windows: int) -> None:
        """Start the next :meth:`train_dataloader` ``windows`` windows (optimizer steps) into its epoch.

        A mid-epoch resume (:class:`~hf_lightning.resume.CheckpointResume`) calls this; only the next epoch's
        loader skips, by index where it can (see :class:`~hf_lightning.data.windows.WindowedLoader`).
        """
        self._skip_windows = windows

    def train_loader(self) -> DataLoader:
        """The per-micro-batch train ``DataLoader`` (built once)."""
        if self.train_dataset is None:
            raise ValueError("Training requires a train_dataset: pass `train_dataset=` to HFDataModule / Trainer.")
        if self._train_loader is None:
            dataset, collator = self._prepare(self.train_dataset, "Training")
            if has_len(dataset) and len(dataset) == 0:
                raise ValueError(
                    "The train_dataset is empty (0 rows): nothing to train on. Check the dataset you passed as "
                    "`train_dataset`."
                )
            kwargs = self._loader_kwargs()
            if self._train_sampler_fn is None or isinstance(dataset, IterableDataset):
                sampler = self.default_train_sampler(dataset)
            else:
                sampler = self._train_sampler_fn(dataset)
                if isinstance(sampler, RandomSampler) and not sampler.replacement:
                    seed = self.args.data_seed if self.args.data_seed is not None else torch.initial_seed()
                    sampler = SeedableRandomSampler(dataset, seed)
            world, rank = self._layout()
            batch_size = self.args.train_batch_size
            if sampler is not None:
                drop_last = bool(self.args.dataloader_drop_last)
                if kwargs["num_workers"] > 0:
                    kwargs["worker_init_fn"] = lambda wid: _seed_worker(wid, kwargs["num_workers"], rank)
                if world > 1:
                    # Every process draws the same shuffle; batch i goes to process i % world (accelerate's way), or
                    # with split_batches every process takes its slice of each batch. dispatch_batches (one process
                    # loads and sends) hands each process the same rows as this, so it needs nothing here.
                    accelerate = self.args.accelerator_config
                    kwargs["batch_sampler"] = ShardedBatchSampler(
                        BatchSampler(sampler, batch_size, drop_last), world, rank,
                        even_batches=bool(accelerate.get("even_batches", True)),
                        split_batches=bool(accelerate.get("split_batches", False)))
                    batch_size = 1  # DataLoader's default; it must stay untouched next to a batch_sampler
                else:
                    kwargs.update(sampler=sampler, drop_last=drop_last)
            elif world > 1:
                self._train_loader = self._iterable_loader(dataset, collator, kwargs, world, rank, whole=False)
                return self._train_loader
            self._train_loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collator, **kwargs)
        return self._train_loader

    def _iterable_loader(self, dataset: Any, collator: Callable, kwargs: dict[str, Any], world: int, rank: int,
                         whole: bool, batch_size: int | None = None) -> Any:
        """An iterable dataset's loader under several processes, as accelerate prepares it (``dispatch.py``):
        process 0 reads and sends (``dispatch_batches``, the default for iterable data), or every process reads
        the stream and keeps its share."""
        accelerate = self.args.accelerator_config
        split = bool(accelerate.get("split_batches", False)) and not whole
        # HF passes no drop_last to an iterable dataset's DataLoader: dataloader_drop_last changes nothing here.
        batch_size = self.args.train_batch_size if batch_size is None else batch_size
        if accelerate.get("dispatch_batches") is None or accelerate.get("dispatch_batches"):
            loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collator, **kwargs)
            return DispatchedLoader(loader, broadcast_from_first, rank, world, split_batches=split, whole=whole)
        if whole:
            return DataLoader(dataset, batch_size=batch_size, collate_fn=collator, **kwargs)
        shard = IterableShard(dataset, batch_size, world, rank, split_batches=split)
        return DataLoader(shard, batch_size=batch_size // world if split else batch_size, collate_fn=collator,
                          **kwargs)

    def _layout(self) -> tuple[int, int]:
        """``(processes, rank)`` sharing the data in the Lightning run this datamodule is attached to (1, 0 before
        that); a tensor-parallel group counts once (``parallelism_config.tp_size``)."""
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return data_parallel_layout(trainer.world_size, trainer.global_rank,
                                    getattr(self.args, "parallelism_config", None))

    def train_micro_batches(self) -> int | None:
        """``len(train_dataloader)`` in micro-batches, or ``None`` for an unsized dataset."""
        loader = self.train_loader()
        try:
            return len(loader)
        except TypeError:
            return None

    def num_train_examples(self) -> int | None:
        return len(self.train_dataset) if self.train_dataset is not None and has_len(self.train_dataset) else None

    def train_dataloader(self) -> WindowedLoader:
        skip, self._skip_windows = self._skip_windows, 0
        return WindowedLoader(self.train_loader(), int(self.args.gradient_accumulation_steps), skip_windows=skip)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # An unsized train loader's windows are loaded here, after Lightning's look-ahead and before the batch
        # hooks (and a resume's RNG restore), which is where HF loads a window (see windows.PendingWindow).
        return load_window(batch)

    # ------------------------------------------------------------------ eval / test
    @property
    def eval_names(self) -> list[str | None]:
        """Names of the eval datasets in dataloader order (``[None]`` for a single dataset)."""
        if isinstance(self.eval_dataset, Mapping):
            return list(self.eval_dataset.keys())
        return [None] if self.eval_dataset is not None else []

    def eval_datasets(self) -> list[Any]:
        if isinstance(self.eval_dataset, Mapping):
            return list(self.eval_dataset.values())
        return [self.eval_dataset] if self.eval_dataset is not None else []

    def eval_loader(self, dataset: Any, description: str = "Evaluation") -> DataLoader:
        """A sequential dataloader over ``dataset`` with the eval batch size.

        Under several processes each one gets its own share of a sized dataset (at most ``ceil(n / world)``
        examples, none repeated, see :class:`~hf_lightning.data.samplers.EvalShardBatchSampler`), and the module
        gathers the results. An ``IterableDataset``, or a set smaller than the number of processes, is evaluated
        whole on every process; an ``IterableDataset`` is read by process 0 only, which sends every batch to the
        others (accelerate's ``dispatch_batches``: a collator's random draws happen on process 0 only, as in HF).
        """
        dataset, collator = self._prepare(dataset, description)
        kwargs = self._loader_kwargs()
        if isinstance(dataset, IterableDataset) and self._eval_layout()[0] > 1:
            world, rank = self._eval_layout()
            return self._iterable_loader(dataset, collator, kwargs, world, rank, whole=True,
                                         batch_size=self.args.eval_batch_size)
        if not isinstance(dataset, IterableDataset) and has_len(dataset):
            sampler = SequentialSampler(dataset) if self._eval_sampler_fn is None \
                else self._eval_sampler_fn(dataset)
            drop_last = bool(self.args.dataloader_drop_last)
            world, rank = self._eval_layout()
            if world > 1:
                shard = EvalShardBatchSampler(sampler if sampler is not None else SequentialSampler(dataset),
                                              self.args.eval_batch_size, drop_last, world, rank)
                if shard.num_positions() >= world:
                    return DataLoader(dataset, batch_sampler=shard, collate_fn=collator, **kwargs)
            kwargs["sampler"] = sampler
            kwargs["drop_last"] = drop_last
        return DataLoader(dataset, batch_size=self.args.eval_batch_size, collate_fn=collator, **kwargs)

    def _eval_layout(self) -> tuple[int, int]:
        """``(world size, rank)`` for an eval loader: the attached run's, else the launcher's (the facade builds
        its evaluation loaders before the ``lightning.Trainer`` that runs them)."""
        if self.trainer is not None:
            return self._layout()
        return data_parallel_layout(int(self.args.world_size), int(self.args.process_index),
                                    getattr(self.args, "parallelism_config", None))

    def val_dataloader(self) -> list[DataLoader]:
        datasets = self.eval_datasets()
        if not datasets:
            return []
        return [self.eval_loader(d) for d in datasets]

    def test_dataloader(self) -> DataLoader:
        if self.test_dataset is None:
            raise ValueError("Prediction requires a test_dataset.")
        return self.eval_loader(self.test_dataset, "test")
