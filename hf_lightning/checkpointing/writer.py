"""Writing HF's ``checkpoint-N`` folder crash-safely: stage the files in a hidden folder, then publish it by a rename.

A folder written here has the files HF's Trainer writes (model weights via ``save_pretrained`` or
``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth``,
``trainer_state.json``, ``training_args.bin``) plus ``training_args.json``, so HF's Trainer resumes from it and we
resume from folders HF wrote. What goes in is one :class:`CheckpointContents`; how the model's own files are
written is its ``model_state`` (:mod:`hf_lightning.checkpointing.model_state`).

Difference from HF on purpose, crash safety: everything is written into a hidden sibling folder
(``.tmp-checkpoint-N-<pid>``), then renamed to ``checkpoint-N``. A crash at any moment leaves either the previous
state or the complete new folder, never a half-written ``checkpoint-N``. ``trainer_state.json`` is the last file
written. Getting the data onto the disk (``fsync``) is :mod:`hf_lightning.checkpointing.durability`'s job.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from hf_lightning._utils import enum_value
from hf_lightning.checkpointing.durability import flush_in_background, fsync_path, fsync_tree
from hf_lightning.checkpointing.errors import CheckpointSaveError
from hf_lightning.checkpointing.layout import (
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    SUPERSEDED_CHECKPOINT_PREFIX,
    TEMPORARY_CHECKPOINT_PREFIX,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_JSON_NAME,
    TRAINING_ARGS_NAME,
    checkpoint_folder_name,
    checkpoint_step,
    rng_file_name,
)
from hf_lightning.checkpointing.model_state import ModelState, PlainModelState, gather_optimizer_state, model_state_for
from hf_lightning.checkpointing.rng import capture_rng_state
from hf_lightning.checkpointing.safe_load import mask_tokens
from hf_lightning.checkpointing.space import checkpoint_space_report

__all__ = ["CheckpointContents", "is_saving_process", "save_model_files", "save_training_args", "write_checkpoint"]

logger = logging.getLogger(__name__)

_SAVE_STRATEGIES_TRACKING_BEST = ("steps", "epoch", "best")
# `save_model_files(gathered=...)` left out: the model state is gathered there (None is a valid gathered value).
_GATHER_HERE = object()


@dataclasses.dataclass(frozen=True)
class CheckpointContents:
    """Everything one ``checkpoint-N`` folder is written from, and how (see :func:`write_checkpoint`).

    Attributes:
        global_step: Optimizer steps done; names the folder.
        model: The model, possibly wrapped under ``.module``.
        optimizer: Its ``state_dict()`` goes to ``optimizer.pt``; required for a full checkpoint.
        scheduler: Its ``state_dict()`` goes to ``scheduler.pt``; required for a full checkpoint.
        state: The ``TrainerState`` (anything with ``save_to_json``, ``best_global_step``,
            ``best_model_checkpoint`` and ``stateful_callbacks``).
        args: Training arguments (``training_args.bin``/``.json``; ``save_strategy`` is read); may be None.
        processing_class: Tokenizer / processor to save alongside.
        data_collator: Its ``tokenizer`` is saved when ``processing_class`` is None.
        scaler: A ``torch.amp.GradScaler`` whose state goes to ``scaler.pt``.
        extra_callback_states: ``{class name: state}`` of stateful callbacks, stored in
            ``state.stateful_callbacks`` before ``trainer_state.json`` is written.
        save_only_model: Skip optimizer, scheduler, scaler and RNG files.
        model_state: How the model's files are gathered, written and loaded back; the plain kind by default.
        process_index: Global rank of this process.
        world_size: Number of processes.
        should_save: Whether this process writes the shared files (HF's ``args.should_save``).
        barrier: Synchronises all processes; required when ``world_size > 1``.
        all_succeeded: With ``world_size > 1``, used instead of ``barrier`` where the processes wait for each
            other: called on every process with whether its part succeeded, returns whether every process's did
            (e.g. ``functools.partial(trainer.strategy.reduce_boolean_decision, all=True)``). With it a failed
            write on one process makes every process raise, instead of leaving the others waiting.
        keep_replaced: Keep an existing ``checkpoint-{global_step}`` (one an earlier run wrote) aside instead of
            deleting it.
        flush_in_background: Return before the files are flushed to disk; the flush is queued with
            :func:`hf_lightning.checkpointing.durability.run_in_background` (ignored with ``world_size > 1``).
    """

    global_step: int
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    state: Any
    args: Any
    processing_class: Any = None
    data_collator: Any = None
    scaler: Any = None
    extra_callback_states: dict[str, Any] | None = None
    save_only_model: bool = False
    model_state: ModelState = dataclasses.field(default_factory=PlainModelState)
    process_index: int = 0
    world_size: int = 1
    should_save: bool = True
    barrier: Callable[[], None] | None = None
    all_succeeded: Callable[[bool], bool] | None = None
    keep_replaced: bool = False
    flush_in_background: bool = False


def is_saving_process(args: Any, global_rank: int, local_rank: int) -> bool:
    """Whether this process writes the shared checkpoint files (HF's ``args.should_save``).

    Global rank 0, or every node's local rank 0 with ``save_on_each_node`` (nodes that share no filesystem).
    """
    if getattr(args, "save_on_each_node", False):
        return local_rank == 0
    return global_rank == 0


# ---- the files of a model folder -------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _training_args_json(args: Any) -> str | None:
    """Serialise arguments as JSON: their own ``to_json_string``, else their fields; None when neither exists."""
    if callable(getattr(args, "to_json_string", None)):
        return args.to_json_string()
    if callable(getattr(args, "to_dict", None)):
        values = args.to_dict()
    elif hasattr(args, "__dataclass_fields__"):
        values = {name: getattr(args, name) for name, spec in args.__dataclass_fields__.items() if spec.init}
    else:
        return None
    return json.dumps(_jsonable(mask_tokens(values)), indent=2)


def save_training_args(args: Any, output_dir: str | os.PathLike) -> None:
    """Write ``training_args.bin`` (pickled, as HF does) and ``training_args.json`` (read back on resume).

    Args:
        args: The training arguments (ours, HF's, or any picklable dataclass).
        output_dir: Destination folder (must exist).
    """
    # The pickle keeps folders interchangeable with HF's; the JSON lets us read the arguments without unpickling.
    torch.save(args, os.path.join(output_dir, TRAINING_ARGS_NAME))
    text = _training_args_json(args)
    if text is None:
        logger.info(
            "%s has no to_json_string() and is no dataclass; %s not written.",
            type(args).__name__,
            TRAINING_ARGS_JSON_NAME,
        )
        return
    with open(os.path.join(output_dir, TRAINING_ARGS_JSON_NAME), "w", encoding="utf-8") as f:
        f.write(text)


def save_model_files(
    model: torch.nn.Module,
    output_dir: str | os.PathLike,
    processing_class: Any = None,
    data_collator: Any = None,
    args: Any = None,
    *,
    model_state: ModelState | None = None,
    gathered: Any = _GATHER_HERE,
) -> None:
    """Write the model (and tokenizer, arguments) into ``output_dir`` the way HF's ``Trainer._save`` does.

    The model's own files are written by ``model_state`` (for the default plain kind: ``save_pretrained`` when the
    model has it, else ``model.safetensors``; see :class:`~hf_lightning.checkpointing.model_state.PlainModelState`).

    Args:
        model: The model, possibly wrapped (DDP) under ``.module``.
        output_dir: Destination folder, created if missing.
        processing_class: Tokenizer / processor; its ``save_pretrained`` is called when present.
        data_collator: Used when ``processing_class`` is None: its ``tokenizer.save_pretrained`` is called when
            it has one, as HF does.
        args: Training arguments, written as ``training_args.bin`` and ``training_args.json``; skipped when None.
        model_state: How the model is saved; when None, the one
            :func:`~hf_lightning.checkpointing.model_state.model_state_for` chooses.
        gathered: What ``model_state.gather`` returned, when the caller ran that step on every process already (as
            :func:`write_checkpoint` does); when left out it runs here.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    model_state = model_state or model_state_for(model)
    if gathered is _GATHER_HERE:
        gathered = model_state.gather(model, output_dir)
    model_state.write(gathered, output_dir)

    tokenizer = processing_class
    if tokenizer is None and data_collator is not None:
        tokenizer = getattr(data_collator, "tokenizer", None)
    if tokenizer is not None:
        if callable(getattr(tokenizer, "save_pretrained", None)):
            tokenizer.save_pretrained(output_dir)
        else:
            logger.warning(
                "%s has no save_pretrained(); its files are not saved in %s.", type(tokenizer).__name__, output_dir
            )

    if args is not None:
        save_training_args(args, output_dir)


# ---- the files of a checkpoint folder --------------------------------------------------------------------------


def _require(value: Any, name: str) -> None:
    if value is None:
        raise ValueError(
            f"write_checkpoint(..., {name}=None): a full checkpoint stores the {name} state. Pass the {name}, or "
            "save_only_model=True to write model weights and trainer_state.json only."
        )


def _write_contents(folder: str, run_dir: str, contents: CheckpointContents) -> None:
    """Write the checkpoint's files into ``folder`` in HF's order, ``trainer_state.json`` last (every process)."""
    c = contents
    # Every process takes part, whether or not it writes the shared files (a sharded model gathers here).
    gathered = c.model_state.gather(c.model, folder)
    if c.should_save:
        save_model_files(c.model, folder, processing_class=c.processing_class, data_collator=c.data_collator,
                         args=c.args, model_state=c.model_state, gathered=gathered)

    # HF points `best_model_checkpoint` at the best step's folder once that folder exists; the current step's
    # folder only exists after the rename here, so it counts as existing.
    best_step = getattr(c.state, "best_global_step", None)
    save_strategy = str(enum_value(getattr(c.args, "save_strategy", "steps")))
    if best_step and save_strategy in _SAVE_STRATEGIES_TRACKING_BEST:
        best_dir = os.path.join(run_dir, checkpoint_folder_name(best_step))
        if best_step == c.global_step or os.path.exists(best_dir):
            c.state.best_model_checkpoint = best_dir

    if not c.save_only_model:
        # Every process takes part (a sharded optimizer gathers its state, or writes its shard, here).
        save_optimizer = getattr(c.model_state, "save_optimizer", None)
        if save_optimizer is not None:
            save_optimizer(c.model, c.optimizer, folder, c.should_save)
        else:
            optimizer_state = gather_optimizer_state(c.model_state, c.model, c.optimizer)
            if c.should_save:
                torch.save(optimizer_state, os.path.join(folder, OPTIMIZER_NAME))
        if c.should_save:
            torch.save(c.scheduler.state_dict(), os.path.join(folder, SCHEDULER_NAME))
            if c.scaler is not None:
                torch.save(c.scaler.state_dict(), os.path.join(folder, SCALER_NAME))
        # Every process writes its own RNG file, whether or not it writes the shared ones.
        rng_path = os.path.join(folder, rng_file_name(c.process_index, c.world_size))
        torch.save(capture_rng_state(distributed=c.world_size > 1), rng_path)

    if c.should_save:
        if c.extra_callback_states:
            # HF appends to a list entry on every save, so the stored list grows; we store the current states only.
            c.state.stateful_callbacks.update(c.extra_callback_states)
        c.state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))


# ---- publishing: the rename ------------------------------------------------------------------------------------


def _superseded_path(final: str) -> str:
    parent, name = os.path.split(final)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = os.path.join(parent, f"{SUPERSEDED_CHECKPOINT_PREFIX}{name}-{stamp}")
    suffix = 1
    while os.path.lexists(candidate):
        suffix += 1
        candidate = os.path.join(parent, f"{SUPERSEDED_CHECKPOINT_PREFIX}{name}-{stamp}-{suffix}")
    return candidate


def _set_aside(final: str) -> None:
    """Rename an existing ``final`` (an earlier run's folder) to ``superseded-<name>-<time>`` so nothing deletes it."""
    if not os.path.lexists(final):
        return
    aside = _superseded_path(final)
    os.replace(final, aside)
    fsync_path(os.path.dirname(final), directory=True)
    logger.warning(
        "%s already existed and was not written by this run; it is kept as %s (a new run never deletes checkpoints "
        "it did not write). Delete it when you no longer need it.",
        final,
        aside,
    )


def _withdraw(final: str, displaced: str | None) -> None:
    """Take a published ``final`` back (its data did not reach the disk), and put the folder it replaced back."""
    parent, name = os.path.split(final)
    hidden = os.path.join(parent, f"{TEMPORARY_CHECKPOINT_PREFIX}{checkpoint_step(name)}-{os.getpid()}-withdrawn")
    try:
        os.replace(final, hidden)
        if displaced is not None and os.path.lexists(displaced):
            os.replace(displaced, final)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def _flush_failed(run_dir: str, final: str, displaced: str | None, err: OSError) -> None:
    """A queued flush failed: withdraw the folder and raise the save's error (on the background thread)."""
    space = checkpoint_space_report(run_dir, final, written=final)
    _withdraw(final, displaced)
    raise CheckpointSaveError(final, err, space) from err


def _publish(temporary: str, final: str, flush: bool = True) -> None:
    """Rename ``temporary`` to ``final``; an existing ``final`` is swapped out first and deleted afterwards.

    With ``flush=False`` the flush of the renamed folder is queued on the background thread, and the deletion of
    the folder it replaced is queued behind that flush, so the old data goes only once the new data is on disk.
    A flush that fails after the rename takes ``final`` back and restores the folder it replaced.
    """
    parent = os.path.dirname(final)
    displaced = None
    if not os.path.lexists(final):
        os.replace(temporary, final)
    else:
        # HF writes into an existing folder; we replace it whole. A crash between the two renames leaves the old
        # folder under a `.tmp-checkpoint-*` name, which resume ignores and stale cleanup removes.
        displaced = temporary + ".replaced"
        if os.path.lexists(displaced):
            shutil.rmtree(displaced)
        os.replace(final, displaced)
        try:
            os.replace(temporary, final)
        except BaseException:
            # Never leave the step without its folder: put the old one back.
            os.replace(displaced, final)
            raise
    if flush:
        try:
            fsync_path(parent, directory=True)
        except OSError:
            _withdraw(final, displaced)
            raise
        if displaced is not None:
            shutil.rmtree(displaced, ignore_errors=True)
        return
    flush_in_background(final, then_remove=displaced,
                        on_failure=functools.partial(_flush_failed, parent, final, displaced))


# ---- the whole sequence ----------------------------------------------------------------------------------------


def write_checkpoint(run_dir: str | os.PathLike, contents: CheckpointContents | int, /, **fields: Any) -> str:
    """Write ``run_dir/checkpoint-{global_step}`` with HF's files, crash-safely.

    Files, as HF's ``_save_checkpoint``: model files (:func:`save_model_files`), ``optimizer.pt``,
    ``scheduler.pt``, ``scaler.pt`` (only with a ``scaler``), ``rng_state.pth`` (``rng_state_{rank}.pth`` when
    ``world_size > 1``), ``trainer_state.json`` and ``training_args.bin`` / ``.json``. With
    ``save_only_model=True`` only the model files, arguments and ``trainer_state.json``.

    Like HF, when ``state.best_global_step`` is set (and ``args.save_strategy`` is steps/epoch/best),
    ``state.best_model_checkpoint`` is pointed at that step's folder if it exists (or is the one being written)
    before ``trainer_state.json`` is saved. Rotation (``save_total_limit``) is not done here; call
    :func:`hf_lightning.checkpointing.rotation.rotate_checkpoints` afterwards on ``should_save`` processes.

    Crash safety: the files go to ``run_dir/.tmp-checkpoint-{global_step}-{pid}``, are fsynced, and the folder
    is renamed to ``checkpoint-{global_step}``. With ``flush_in_background`` (one process only) the folder is
    renamed as soon as its files are written, which already makes it safe against the process being killed, and
    the ``fsync`` that makes it survive a power cut runs on a background thread
    (:mod:`hf_lightning.checkpointing.durability`); queue anything that deletes older checkpoints behind it. An
    existing folder of that name is replaced as a whole (HF writes into it); with ``keep_replaced`` it is renamed
    to ``superseded-checkpoint-{global_step}-<time>`` instead of deleted. If writing fails, the temporary folder is
    removed and the error propagates (an ``OSError`` such as a full disk as :class:`CheckpointSaveError`, which
    also says how much space the checkpoint needs and how much is free); every existing ``checkpoint-N`` is
    untouched. A background flush that fails withdraws the published folder again (restoring one it replaced),
    drops the jobs queued behind it (the rotation) and its ``CheckpointSaveError`` is raised by the next
    :func:`~hf_lightning.checkpointing.durability.wait_for_flushes` / ``raise_failed_jobs``.

    Several processes (``world_size > 1``): all of them write into one shared ``.tmp-checkpoint-{global_step}``
    folder, so the output directory must be on a filesystem every ``should_save`` process shares with the
    processes it saves for, and exactly one process per filesystem has ``should_save``. The sequence is: the
    ``should_save`` process clears a stale temporary folder, ``barrier()``; every process gathers the model state
    and writes its RNG file and the ``should_save`` process the shared files, ``barrier()``; the ``should_save``
    process renames, ``barrier()``. With ``all_succeeded`` each ``barrier()`` is that call instead, and a process
    that fails makes every process raise; without it a process that fails leaves the others waiting at a barrier,
    as any collective save does.

    Args:
        run_dir: The output directory holding ``checkpoint-N`` folders.
        contents: What to write and how (:class:`CheckpointContents`). Or the global step, with the other fields
            of :class:`CheckpointContents` as keywords: ``write_checkpoint(run_dir, 3, model=..., ...)``.
        **fields: With a step: the contents' fields. With a :class:`CheckpointContents`: fields to replace in it.

    Returns:
        The path of the checkpoint folder, ``os.path.join(run_dir, f"checkpoint-{global_step}")``.

    Raises:
        ValueError: ``optimizer`` or ``scheduler`` is None for a full checkpoint, or ``barrier`` is missing with
            ``world_size > 1``.
        CheckpointSaveError: Writing failed with an ``OSError`` (disk full, permission denied, ...).
    """
    if isinstance(contents, CheckpointContents):
        contents = dataclasses.replace(contents, **fields) if fields else contents
    else:
        contents = CheckpointContents(global_step=contents, **fields)
    run_dir = os.fspath(run_dir)
    final = os.path.join(run_dir, checkpoint_folder_name(contents.global_step))
    if not contents.save_only_model and contents.should_save:
        _require(contents.optimizer, "optimizer")
        _require(contents.scheduler, "scheduler")
    if contents.world_size > 1:
        _write_together(run_dir, final, contents)
    elif contents.should_save:
        _write_alone(run_dir, final, contents)
    else:
        # One process that does not save: HF would only leave an RNG file in an incomplete folder; write nothing.
        logger.debug("write_checkpoint: should_save is False in a single-process run; nothing written.")
    return final


def _write_alone(run_dir: str, final: str, contents: CheckpointContents) -> None:
    """One process: stage in a folder of its own, flush (or queue the flush), publish."""
    temporary = os.path.join(run_dir, f"{TEMPORARY_CHECKPOINT_PREFIX}{contents.global_step}-{os.getpid()}")
    try:
        os.makedirs(run_dir, exist_ok=True)
        if os.path.lexists(temporary):
            shutil.rmtree(temporary)
        os.makedirs(temporary)
        _write_contents(temporary, run_dir, contents)
        if not contents.flush_in_background:
            fsync_tree(temporary)
        if contents.keep_replaced:
            _set_aside(final)
        _publish(temporary, final, flush=not contents.flush_in_background)
    except OSError as err:
        shutil.rmtree(temporary, ignore_errors=True)
        raise _save_error(run_dir, final, contents, err) from err
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _save_error(run_dir: str, final: str, contents: CheckpointContents, err: OSError) -> CheckpointSaveError:
    """The error for a failed save, with the space it needs measured (after the staging folder is gone)."""
    optimizer = None if contents.save_only_model else contents.optimizer
    space = checkpoint_space_report(run_dir, final, model=contents.model, optimizer=optimizer)
    return CheckpointSaveError(final, err, space)


def _write_together(run_dir: str, final: str, contents: CheckpointContents) -> None:
    """Several processes: one shared staging folder, the processes in step between the phases, one publishes.

    With ``all_succeeded`` the processes tell each other at each meeting point whether their part worked; when one
    failed, every process raises (the others with a :class:`CheckpointSaveError` that says another process
    failed) after the saving process removed the staging folder, so no process is left waiting.
    """
    barrier = contents.barrier
    if barrier is None:
        raise ValueError(
            f"write_checkpoint(world_size={contents.world_size}) needs `barrier`, a callable that waits for every "
            "process (e.g. `trainer.strategy.barrier`), so that the folder is renamed only once all "
            "processes have written their files."
        )
    temporary = os.path.join(run_dir, f"{TEMPORARY_CHECKPOINT_PREFIX}{contents.global_step}")
    phases = _Phases(run_dir, final, temporary, contents)

    def prepare() -> None:
        shutil.rmtree(temporary, ignore_errors=True)
        os.makedirs(temporary)

    def write() -> None:
        os.makedirs(temporary, exist_ok=True)
        _write_contents(temporary, run_dir, contents)

    def publish() -> None:
        fsync_tree(temporary)
        if contents.keep_replaced:
            _set_aside(final)
        _publish(temporary, final)

    phases.run(prepare if contents.should_save else None)
    phases.run(write)
    phases.run(publish if contents.should_save else None)
    if os.path.isdir(temporary):
        logger.warning(
            "%s was not renamed to %s: no process with should_save shares this filesystem. Only the RNG file "
            "of process %d is in it.",
            temporary,
            final,
            contents.process_index,
        )


class _Phases:
    """Runs the phases of a several-process save, each followed by a meeting of every process."""

    def __init__(self, run_dir: str, final: str, temporary: str, contents: CheckpointContents) -> None:
        self.run_dir, self.final, self.temporary, self.contents = run_dir, final, temporary, contents

    def run(self, phase: Callable[[], Any] | None) -> None:
        c = self.contents
        if c.all_succeeded is None:
            if phase is not None:
                phase()
            c.barrier()
            return
        failure: Exception | None = None
        if phase is not None:
            try:
                phase()
            except Exception as err:  # noqa: BLE001 - told to the other processes first, then raised
                failure = err
        if c.all_succeeded(failure is None):
            return
        if c.should_save:
            shutil.rmtree(self.temporary, ignore_errors=True)
        if isinstance(failure, OSError):
            raise _save_error(self.run_dir, self.final, c, failure) from failure
        if failure is not None:
            raise failure
        other = OSError(errno.ECANCELED, f"another process could not write its part of it (this one, process "
                                         f"{c.process_index}, wrote its own; the failing process's error names "
                                         "the cause)")
        raise CheckpointSaveError(self.final, other)
