"""HF's ``checkpoint-N`` folder: writing it crash-safely and loading it without unpickling arbitrary objects.

A folder written here has the files HF's Trainer writes (model weights via ``save_pretrained`` or
``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth``,
``trainer_state.json``, ``training_args.bin``) plus ``training_args.json``, so HF's Trainer resumes from it and we
resume from folders HF wrote.

Two things differ from HF on purpose:

* **Crash safety.** Everything is written into a hidden sibling folder (``.tmp-checkpoint-N-<pid>``), flushed
  to disk, then renamed to ``checkpoint-N``. A crash at any moment leaves either the previous state or the
  complete new folder, never a half-written ``checkpoint-N``. ``trainer_state.json`` is the last file written.
* **Safe loading.** Every ``torch.load`` uses ``weights_only=True``; a damaged or tampered file raises
  :class:`CheckpointLoadError` naming the file. The pickled ``training_args.bin`` HF writes is never unpickled:
  :func:`load_training_args` reads ``training_args.json`` or decodes the pickle without importing anything.
"""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import pickle
import re
import shutil
import time
import zipfile
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, NamedTuple

import safetensors.torch
import torch

from hf_lightning.checkpointing.durability import run_in_background
from hf_lightning.checkpointing.paths import TRAINER_STATE_NAME, checkpoint_folder_name
from hf_lightning.checkpointing.rng import capture_rng_state, rng_file_name, rng_safe_globals

__all__ = [
    "CONFIG_NAME",
    "OPTIMIZER_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TEMPORARY_CHECKPOINT_PREFIX",
    "TRAINING_ARGS_JSON_NAME",
    "TRAINING_ARGS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "SUPERSEDED_CHECKPOINT_PREFIX",
    "CheckpointLoadError",
    "CheckpointSaveError",
    "WeightsLoadResult",
    "has_model_weights",
    "is_complete_checkpoint",
    "load_model_weights",
    "load_optimizer_and_scheduler",
    "load_scaler",
    "load_training_args",
    "safe_torch_load",
    "save_model_files",
    "save_training_args",
    "verify_checkpoint_files",
    "write_checkpoint",
]

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON_NAME = "training_args.json"
TEMPORARY_CHECKPOINT_PREFIX = ".tmp-checkpoint-"
# An earlier run's `checkpoint-N` that a new run writes over is kept under this prefix (see `write_checkpoint`). The
# name starts with neither `checkpoint-` (HF's rotation glob) nor `.tmp-checkpoint-` (stale-folder cleanup).
SUPERSEDED_CHECKPOINT_PREFIX = "superseded-"

# Weight files that make a folder loadable as a model: full/sharded weights and PEFT adapters (as HF accepts).
_WEIGHT_FILES = (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    WEIGHTS_INDEX_NAME,
    "adapter_model.safetensors",
    "adapter_model.bin",
)
# FSDP writes its model as `pytorch_model_fsdp*` (file or folder), DeepSpeed as a `latest` tag plus a folder.
_FSDP_MODEL_PREFIX = "pytorch_model_fsdp"
_DEEPSPEED_TAG_FILE = "latest"
_SAVE_STRATEGIES_TRACKING_BEST = ("steps", "epoch", "best")


class CheckpointLoadError(ValueError):
    """A checkpoint file exists but cannot be loaded safely (truncated, corrupt or tampered with).

    Attributes:
        path: The file that failed to load.
        reason: Why, in words.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        folder = os.path.dirname(self.path) or "."
        super().__init__(
            f"Cannot load {self.path}: {reason}. The checkpoint folder {folder} is damaged or was modified after "
            "it was saved; delete that folder (or move it out of the output directory) and resume from another "
            "checkpoint, or start training from scratch."
        )


_SAVE_ADVICE = {
    errno_code: advice
    for codes, advice in (
        (("ENOSPC", "EDQUOT"), "Free disk space (or lower save_total_limit, or use an output_dir on a larger disk)"),
        (("EACCES", "EPERM", "EROFS"), "Make output_dir writable (or choose another output_dir)"),
    )
    for errno_code in codes
}


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, no permission, ...); nothing of it was published.

    The ``errno`` of the underlying ``OSError`` is kept. Earlier checkpoints are untouched, so training can be
    resumed from the last one once the cause is fixed.

    Attributes:
        folder: The ``checkpoint-N`` folder that was being written.
    """

    def __init__(self, folder: str, cause: OSError):
        import errno as errno_module

        self.folder = folder
        name = errno_module.errorcode.get(cause.errno or 0, "")
        advice = _SAVE_ADVICE.get(name, "Fix the cause")
        where = f" ({cause.filename})" if cause.filename else ""
        super().__init__(
            cause.errno,
            f"Could not save the checkpoint {folder}: {cause.strerror or cause}{where}. Nothing of it was published "
            f"and the earlier checkpoints in {os.path.dirname(folder) or '.'} are intact. {advice}, then resume with "
            "train(resume_from_checkpoint=True) / fit(ckpt_path=get_last_checkpoint(output_dir)).",
        )


class WeightsLoadResult(NamedTuple):
    """Keys that did not match when loading weights (as ``nn.Module.load_state_dict`` reports them)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


# ---------------------------------------------------------------------------------------------------------------
# Safe loading
# ---------------------------------------------------------------------------------------------------------------


def _describe_load_failure(err: Exception) -> str:
    """Say why ``torch.load(weights_only=True)`` failed, without repeating torch's advice to disable it."""
    if isinstance(err, pickle.UnpicklingError):
        text = str(err)
        match = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"but got <class '([^']+)'>", text)
        if match:
            return (
                f"it references `{match.group(1)}`, which is neither a tensor nor a plain container, so loading "
                "it could run arbitrary code and was refused"
            )
        return "it holds objects other than tensors and plain containers, so loading it was refused"
    return f"the file is truncated or corrupt ({type(err).__name__})"


def safe_torch_load(
    path: str | os.PathLike, map_location: Any = "cpu", extra_safe_globals: Iterable[Any] | None = None
) -> Any:
    """Load a file written with ``torch.save`` using ``weights_only=True``.

    Args:
        path: The file.
        map_location: Where tensors go, as for ``torch.load``.
        extra_safe_globals: Globals to allow besides torch's defaults, as for
            ``torch.serialization.safe_globals`` (e.g. the NumPy types in an RNG file).

    Returns:
        The loaded object (tensors and plain containers only).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointLoadError: The file is truncated, corrupt or holds anything besides tensors, plain containers
            and the allowed globals.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint file {os.fspath(path)} does not exist.")
    try:
        if extra_safe_globals:
            with torch.serialization.safe_globals(list(extra_safe_globals)):
                return torch.load(path, map_location=map_location, weights_only=True)
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure mode of a damaged file ends in the same advice
        # `from None`: torch's own message recommends turning safe loading off, which we never want to show.
        raise CheckpointLoadError(path, _describe_load_failure(err)) from None


def _safetensors_load(path: str) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for every corrupt layout
        raise CheckpointLoadError(path, f"the file is truncated or corrupt ({type(err).__name__}: {err})") from err


# ---------------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------------


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    # DDP / DataParallel / our own wrappers keep the real model under `.module`.
    return getattr(model, "module", model)


def _standalone_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make every tensor own its memory, since safetensors refuses tensors that share storage."""
    owners: dict[tuple[str, int], str] = {}
    copied: list[str] = []
    result: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        if tensor.numel() > 0:
            key = (str(tensor.device), tensor.untyped_storage().data_ptr())
            if key in owners:
                copied.append(f"{name} (shares memory with {owners[key]})")
                tensor = tensor.clone()
            else:
                owners[key] = name
        result[name] = tensor.contiguous()
    if copied:
        logger.info("Saving shared tensors as separate copies in %s: %s", SAFE_WEIGHTS_NAME, ", ".join(copied))
    return result


def _accepts_keyword(function: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _mask_tokens(values: dict[str, Any]) -> dict[str, Any]:
    # HF replaces secrets such as `hub_token` by a placeholder before writing arguments as JSON.
    return {key: f"<{key.upper()}>" if key.endswith("_token") else value for key, value in values.items()}


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
    return json.dumps(_jsonable(_mask_tokens(values)), indent=2)


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
) -> None:
    """Write the model (and tokenizer, arguments) into ``output_dir`` the way HF's ``Trainer._save`` does.

    A model with ``save_pretrained`` (a ``PreTrainedModel``, possibly wrapped under ``.module``) saves itself:
    ``config.json``, ``generation_config.json`` when it has one, ``model.safetensors`` (sharded with an index
    when large). Any other module gets its ``state_dict`` in ``model.safetensors`` with metadata
    ``{"format": "pt"}``; tensors sharing memory (tied weights) are stored as separate copies, where HF fails.

    Args:
        model: The model, possibly wrapped (DDP) under ``.module``.
        output_dir: Destination folder, created if missing.
        processing_class: Tokenizer / processor; its ``save_pretrained`` is called when present.
        data_collator: Used when ``processing_class`` is None: its ``tokenizer.save_pretrained`` is called when
            it has one, as HF does.
        args: Training arguments, written as ``training_args.bin`` and ``training_args.json``; skipped when None.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    unwrapped = _unwrap(model)
    save_pretrained = getattr(unwrapped, "save_pretrained", None)
    if callable(save_pretrained):
        # transformers 4.x still takes `safe_serialization`; 5.x always writes safetensors and has no such keyword.
        kwargs = {"safe_serialization": True} if _accepts_keyword(save_pretrained, "safe_serialization") else {}
        save_pretrained(output_dir, **kwargs)
    else:
        safetensors.torch.save_file(
            _standalone_tensors(unwrapped.state_dict()),
            os.path.join(output_dir, SAFE_WEIGHTS_NAME),
            metadata={"format": "pt"},
        )

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


def prepare_model_saving(model: torch.nn.Module) -> None:
    """Build now what transformers' ``save_pretrained`` builds on its first call in a process.

    transformers 5.x's ``save_pretrained`` looks the model up in its table of checkpoint conversions (renamed
    and fused weights), and the first lookup in a process compiles that table: ≈ 860 regular expressions,
    40–50 ms, whatever the model. Done here, before training, the first ``checkpoint-N`` no longer stalls the
    loop for it (HF's Trainer pays it inside its first save). Nothing is written and what ``save_pretrained``
    writes is unchanged: the table is transformers' own module-level cache, filled by transformers' own
    function. Models without ``save_pretrained``, and transformers versions without the table, are left alone.

    Args:
        model: The model that will be saved, possibly wrapped (DDP) under ``.module``.
    """
    unwrapped = _unwrap(model)
    config = getattr(unwrapped, "config", None)
    if not callable(getattr(unwrapped, "save_pretrained", None)) or config is None:
        return
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # transformers 4.x: no conversion table
        return
    try:
        get_checkpoint_conversion_mapping(getattr(config, "model_type", None))
    except Exception as err:  # a warm-up only: the save itself will report any real problem
        logger.debug("Could not prepare transformers' checkpoint conversion table: %s", err)


def _fsync_path(path: str, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        # Some platforms (Windows) cannot open directories; the rename is still atomic there.
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Flush every file and folder under ``root`` so the rename never publishes data still in page cache."""
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync_path(os.path.join(folder, name))
        _fsync_path(folder, directory=True)


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
    _fsync_path(os.path.dirname(final), directory=True)
    logger.warning(
        "%s already existed and was not written by this run; it is kept as %s (a new run never deletes checkpoints "
        "it did not write). Delete it when you no longer need it.",
        final,
        aside,
    )


def _flush_published(final: str) -> None:
    """Flush a renamed checkpoint folder: its files, itself and the parent's entry for it."""
    _fsync_tree(final)
    _fsync_path(os.path.dirname(final), directory=True)


def _publish(temporary: str, final: str, flush: bool = True) -> None:
    """Rename ``temporary`` to ``final``; an existing ``final`` is swapped out first and deleted afterwards.

    With ``flush=False`` the flush of the renamed folder is queued on the background thread, and the deletion of
    the folder it replaced is queued behind that flush, so the old data goes only once the new data is on disk.
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
        _fsync_path(parent, directory=True)
        if displaced is not None:
            shutil.rmtree(displaced, ignore_errors=True)
        return
    run_in_background(f"flushing {final} to disk", _flush_published, final)
    if displaced is not None:
        run_in_background(f"removing {displaced}", shutil.rmtree, displaced, ignore_errors=True)


def _save_strategy(args: Any) -> str:
    value = getattr(args, "save_strategy", "steps")
    return str(getattr(value, "value", value))


def _require(value: Any, name: str) -> None:
    if value is None:
        raise ValueError(
            f"write_checkpoint(..., {name}=None): a full checkpoint stores the {name} state. Pass the {name}, or "
            "save_only_model=True to write model weights and trainer_state.json only."
        )


def _write_contents(
    folder: str,
    run_dir: str,
    global_step: int,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    state: Any,
    args: Any,
    processing_class: Any,
    data_collator: Any,
    save_only_model: bool,
    process_index: int,
    world_size: int,
    should_save: bool,
    scaler: Any,
    extra_callback_states: dict[str, Any] | None,
) -> None:
    """Write the checkpoint's files into ``folder`` in HF's order, ``trainer_state.json`` last."""
    if should_save:
        save_model_files(model, folder, processing_class=processing_class, data_collator=data_collator, args=args)

    # HF points `best_model_checkpoint` at the best step's folder once that folder exists; the current step's
    # folder only exists after the rename here, so it counts as existing.
    best_step = getattr(state, "best_global_step", None)
    if best_step and _save_strategy(args) in _SAVE_STRATEGIES_TRACKING_BEST:
        best_dir = os.path.join(run_dir, checkpoint_folder_name(best_step))
        if best_step == global_step or os.path.exists(best_dir):
            state.best_model_checkpoint = best_dir

    if not save_only_model:
        if should_save:
            torch.save(optimizer.state_dict(), os.path.join(folder, OPTIMIZER_NAME))
            torch.save(scheduler.state_dict(), os.path.join(folder, SCHEDULER_NAME))
            if scaler is not None:
                torch.save(scaler.state_dict(), os.path.join(folder, SCALER_NAME))
        # Every process writes its own RNG file, whether or not it writes the shared ones.
        rng_path = os.path.join(folder, rng_file_name(process_index, world_size))
        torch.save(capture_rng_state(distributed=world_size > 1), rng_path)

    if should_save:
        if extra_callback_states:
            # HF appends to a list entry on every save, so the stored list grows; we store the current states only.
            state.stateful_callbacks.update(extra_callback_states)
        state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))


def write_checkpoint(
    run_dir: str | os.PathLike,
    global_step: int,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    state: Any,
    args: Any,
    processing_class: Any = None,
    data_collator: Any = None,
    save_only_model: bool = False,
    process_index: int = 0,
    world_size: int = 1,
    should_save: bool = True,
    scaler: Any = None,
    extra_callback_states: dict[str, Any] | None = None,
    barrier: Callable[[], None] | None = None,
    keep_replaced: bool = False,
    flush_in_background: bool = False,
) -> str:
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
    (:mod:`hf_lightning.checkpointing.durability`); queue anything that deletes older checkpoints behind it. An existing folder of that name is replaced as a whole (HF writes
    into it); with ``keep_replaced`` it is renamed to ``superseded-checkpoint-{global_step}-<time>`` instead of
    deleted. If writing fails, the temporary folder is removed and the error propagates (an ``OSError`` such as a
    full disk as :class:`CheckpointSaveError`); every existing ``checkpoint-N`` is untouched.

    Several processes (``world_size > 1``): all of them write into one shared ``.tmp-checkpoint-{global_step}``
    folder, so the output directory must be on a filesystem every ``should_save`` process shares with the
    processes it saves for, and exactly one process per filesystem has ``should_save``. The sequence is: the
    ``should_save`` process clears a stale temporary folder, ``barrier()``; every process writes its RNG file
    and the ``should_save`` process the shared files, ``barrier()``; the ``should_save`` process renames,
    ``barrier()``. A process that fails leaves the others waiting at a barrier, as any collective save does.

    Args:
        run_dir: The output directory holding ``checkpoint-N`` folders.
        global_step: Optimizer steps done; names the folder.
        model: The model, possibly wrapped under ``.module``.
        optimizer: Its ``state_dict()`` goes to ``optimizer.pt``.
        scheduler: Its ``state_dict()`` goes to ``scheduler.pt``.
        state: The ``TrainerState`` (anything with ``save_to_json``, ``best_global_step``,
            ``best_model_checkpoint`` and ``stateful_callbacks``).
        args: Training arguments (``training_args.bin``/``.json``; ``save_strategy`` is read); may be None.
        processing_class: Tokenizer / processor to save alongside.
        data_collator: Its ``tokenizer`` is saved when ``processing_class`` is None.
        save_only_model: Skip optimizer, scheduler, scaler and RNG files.
        process_index: Global rank of this process.
        world_size: Number of processes.
        should_save: Whether this process writes the shared files (HF's ``args.should_save``).
        scaler: A ``torch.amp.GradScaler`` whose state goes to ``scaler.pt``.
        extra_callback_states: ``{class name: state}`` of stateful callbacks, stored in
            ``state.stateful_callbacks`` before ``trainer_state.json`` is written.
        barrier: Synchronises all processes; required when ``world_size > 1``.
        keep_replaced: Keep an existing ``checkpoint-{global_step}`` (one an earlier run wrote) aside instead of
            deleting it.
        flush_in_background: Return before the files are flushed to disk; the flush is queued with
            :func:`hf_lightning.checkpointing.durability.run_in_background` (ignored with ``world_size > 1``).

    Returns:
        The path of the checkpoint folder, ``os.path.join(run_dir, f"checkpoint-{global_step}")``.

    Raises:
        ValueError: ``optimizer`` or ``scheduler`` is None for a full checkpoint, or ``barrier`` is missing with
            ``world_size > 1``.
        CheckpointSaveError: Writing failed with an ``OSError`` (disk full, permission denied, ...).
    """
    run_dir = os.fspath(run_dir)
    final = os.path.join(run_dir, checkpoint_folder_name(global_step))
    if not save_only_model and should_save:
        _require(optimizer, "optimizer")
        _require(scheduler, "scheduler")
    contents = dict(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        args=args,
        processing_class=processing_class,
        data_collator=data_collator,
        save_only_model=save_only_model,
        process_index=process_index,
        world_size=world_size,
        should_save=should_save,
        scaler=scaler,
        extra_callback_states=extra_callback_states,
    )

    if world_size > 1:
        if barrier is None:
            raise ValueError(
                f"write_checkpoint(world_size={world_size}) needs `barrier`, a callable that waits for every "
                "process (e.g. `trainer.strategy.barrier`), so that the folder is renamed only once all "
                "processes have written their files."
            )
        temporary = os.path.join(run_dir, f"{TEMPORARY_CHECKPOINT_PREFIX}{global_step}")
        if should_save:
            shutil.rmtree(temporary, ignore_errors=True)
            os.makedirs(temporary)
        barrier()
        os.makedirs(temporary, exist_ok=True)
        _write_contents(temporary, run_dir, global_step, **contents)
        barrier()
        if should_save:
            _fsync_tree(temporary)
            if keep_replaced:
                _set_aside(final)
            _publish(temporary, final)
        barrier()
        if os.path.isdir(temporary):
            logger.warning(
                "%s was not renamed to %s: no process with should_save shares this filesystem. Only the RNG file "
                "of process %d is in it.",
                temporary,
                final,
                process_index,
            )
        return final

    if not should_save:
        # One process that does not save: HF would only leave an RNG file in an incomplete folder; write nothing.
        logger.debug("write_checkpoint: should_save is False in a single-process run; nothing written.")
        return final
    temporary = os.path.join(run_dir, f"{TEMPORARY_CHECKPOINT_PREFIX}{global_step}-{os.getpid()}")
    try:
        os.makedirs(run_dir, exist_ok=True)
        if os.path.lexists(temporary):
            shutil.rmtree(temporary)
        os.makedirs(temporary)
        _write_contents(temporary, run_dir, global_step, **contents)
        if not flush_in_background:
            _fsync_tree(temporary)
        if keep_replaced:
            _set_aside(final)
        _publish(temporary, final, flush=not flush_in_background)
    except OSError as err:
        shutil.rmtree(temporary, ignore_errors=True)
        raise CheckpointSaveError(final, err) from err
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return final


# ---------------------------------------------------------------------------------------------------------------
# Inspecting
# ---------------------------------------------------------------------------------------------------------------


_CHECKPOINT_FOLDER = re.compile(r"^checkpoint-\d+$")
_TORCH_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def _verify_torch_file(path: str, extra_safe_globals: Iterable[Any] | None = None) -> None:
    """Load a ``torch.save`` file the safe way without reading its tensors (memory-mapped), to judge it."""
    if not zipfile.is_zipfile(path):
        # Not a torch.save archive (a raw pickle, an old format, or cut short): judge it by a full safe load.
        safe_torch_load(path, extra_safe_globals=extra_safe_globals)
        return
    try:
        if extra_safe_globals:
            with torch.serialization.safe_globals(list(extra_safe_globals)):
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        else:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - every failure mode of a damaged file ends in the same advice
        raise CheckpointLoadError(path, _describe_load_failure(err)) from None


def verify_checkpoint_files(checkpoint_dir: str | os.PathLike) -> list[str]:
    """Check a checkpoint folder before resuming from it: complete, and no file that could run code when loaded.

    Every pickle-based file at the top of the folder is judged without unpickling anything untrusted:
    ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth`` / ``rng_state_{rank}.pth``,
    ``pytorch_model.bin`` and any other ``*.pt`` / ``*.pth`` / ``*.bin`` through ``torch.load(weights_only=True,
    mmap=True)`` (tensors are mapped, not read), RNG files with exactly the NumPy globals they need, and
    ``training_args.bin`` with a decoder that imports and runs nothing (see :func:`load_training_args`).
    ``trainer_state.json`` and ``training_args.json`` must be valid JSON. A folder named ``checkpoint-N`` (or
    holding optimizer / RNG files) must have ``trainer_state.json``, the file a save writes last.

    Args:
        checkpoint_dir: The folder to resume from.

    Returns:
        The names of the files checked.

    Raises:
        CheckpointLoadError: A file is truncated, corrupt, references code, or ``trainer_state.json`` is missing;
            the message names the file.
    """
    folder = os.fspath(checkpoint_dir)
    names = sorted(os.listdir(folder))
    state_path = os.path.join(folder, TRAINER_STATE_NAME)
    training_files = {OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME}
    has_training_files = any(name in training_files or name.startswith("rng_state") for name in names)
    if TRAINER_STATE_NAME not in names and (
        _CHECKPOINT_FOLDER.match(os.path.basename(folder.rstrip(os.sep))) or has_training_files
    ):
        raise CheckpointLoadError(
            state_path, "it is missing, so the save of this checkpoint did not finish (it is the last file written)"
        )
    checked = []
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name in (TRAINER_STATE_NAME, TRAINING_ARGS_JSON_NAME):
            try:
                with open(path, encoding="utf-8") as f:
                    json.load(f)
            except ValueError as err:
                raise CheckpointLoadError(path, f"it is not valid JSON ({err})") from None
        elif name == TRAINING_ARGS_NAME:
            _read_pickled_args(path)
        elif name.startswith("rng_state") and name.endswith(".pth"):
            _verify_torch_file(path, extra_safe_globals=rng_safe_globals())
        elif name.endswith(_TORCH_FILE_SUFFIXES):
            _verify_torch_file(path)
        else:
            continue
        checked.append(name)
    return checked


def has_model_weights(path: str | os.PathLike) -> bool:
    """Tell whether a folder holds model weights HF's Trainer can resume from.

    Args:
        path: A checkpoint folder.

    Returns:
        True when it has ``model.safetensors``, ``pytorch_model.bin``, a sharded index of either, PEFT adapter
        weights, an FSDP model (``pytorch_model_fsdp*``) or a DeepSpeed ``latest`` tag.
    """
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    if any(os.path.isfile(os.path.join(path, name)) for name in _WEIGHT_FILES if name in names):
        return True
    if _DEEPSPEED_TAG_FILE in names or any(name.startswith(_FSDP_MODEL_PREFIX) for name in names):
        return True
    # Several PEFT adapters are saved in one sub-folder each.
    return any(
        os.path.isfile(os.path.join(path, name, adapter))
        for name in names
        if os.path.isdir(os.path.join(path, name))
        for adapter in ("adapter_model.safetensors", "adapter_model.bin")
    )


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Tell whether a checkpoint folder was fully written: it has ``trainer_state.json`` and model weights.

    ``trainer_state.json`` is the last file both HF and :func:`write_checkpoint` write, so a folder an
    interrupted HF save left behind lacks it.

    Args:
        path: A checkpoint folder.

    Returns:
        True for a directory holding ``trainer_state.json`` and weights (see :func:`has_model_weights`).
    """
    return os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)) and has_model_weights(path)


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def _report_mismatch(model: torch.nn.Module, loaded: Iterable[str], result: WeightsLoadResult, path: str) -> None:
    # A tied weight (GPT-2's lm_head shares wte) is not stored but is loaded through the tensor it shares.
    current = model.state_dict()
    loaded_storage = {current[name].data_ptr() for name in loaded if name in current}
    missing = [name for name in result.missing_keys if current[name].data_ptr() not in loaded_storage]
    if missing:
        logger.warning("Keys missing from the checkpoint at %s (kept as initialised): %s", path, missing)
    if result.unexpected_keys:
        logger.warning(
            "Keys in the checkpoint at %s that the model does not have (ignored): %s", path, result.unexpected_keys
        )


def _refuse_foreign_weights(model: torch.nn.Module, stored: Iterable[str], checkpoint_dir: str) -> None:
    """Refuse weights of which not a single tensor belongs to ``model`` (HF would warn and train from scratch)."""
    stored = list(stored)
    model_keys = list(model.state_dict())
    if not stored or not model_keys or set(stored) & set(model_keys):
        return
    raise ValueError(
        f"The checkpoint at {checkpoint_dir} holds the weights of another model: none of its {len(stored)} tensors "
        f"(e.g. {stored[:3]}) is a parameter of {type(model).__name__} (e.g. {model_keys[:3]}), so nothing would be "
        "loaded. Resume from a checkpoint of this model (check resume_from_checkpoint / ckpt_path), or build the "
        "model these weights belong to."
    )


def _load_state(model: torch.nn.Module, state_dict: dict, strict: bool, path: str) -> Any:
    try:
        return model.load_state_dict(state_dict, strict=strict)
    except RuntimeError as err:
        # torch's message names the tensors; say which files they come from.
        raise RuntimeError(f"Cannot load the weights at {path} into {type(model).__name__}: {err}") from err


def _load_sharded(model: torch.nn.Module, checkpoint_dir: str, index_name: str, strict: bool) -> WeightsLoadResult:
    index_path = os.path.join(checkpoint_dir, index_name)
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointLoadError(index_path, f"it is not a valid shard index ({err})") from err
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        # A shard must sit next to its index; anything else would read files outside the checkpoint.
        if not isinstance(shard, str) or os.path.basename(shard) != shard:
            raise CheckpointLoadError(index_path, f"it names the shard {shard!r}, which is not a file in the folder")
    _refuse_foreign_weights(model, weight_map, checkpoint_dir)
    model_keys = list(model.state_dict())
    result = WeightsLoadResult(
        missing_keys=[key for key in model_keys if key not in weight_map],
        unexpected_keys=[key for key in weight_map if key not in set(model_keys)],
    )
    if strict and (result.missing_keys or result.unexpected_keys):
        raise RuntimeError(
            f"The sharded checkpoint at {checkpoint_dir} does not match {type(model).__name__}: missing keys "
            f"{result.missing_keys}, unexpected keys {result.unexpected_keys}. Pass strict=False to load anyway."
        )
    safe = index_name == SAFE_WEIGHTS_INDEX_NAME
    for shard in shards:
        shard_path = os.path.join(checkpoint_dir, shard)
        state_dict = _safetensors_load(shard_path) if safe else safe_torch_load(shard_path)
        _load_state(model, state_dict, False, shard_path)
        del state_dict
    return result


def load_model_weights(
    model: torch.nn.Module, checkpoint_dir: str | os.PathLike, strict: bool = False
) -> WeightsLoadResult:
    """Load a checkpoint's weights into ``model`` (on CPU first), as HF's ``_load_from_checkpoint`` does.

    Looks for, in order: ``model.safetensors``, ``pytorch_model.bin`` (read with ``weights_only=True``), then a
    sharded ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``. Missing / unexpected keys are
    logged as warnings (a tied weight that is not stored, such as GPT-2's ``lm_head.weight``, is not reported).

    Args:
        model: The model, possibly wrapped under ``.module``.
        checkpoint_dir: A checkpoint folder or a ``save_model`` output folder.
        strict: Raise when keys do not match, as ``load_state_dict(strict=True)``.

    Returns:
        The missing and unexpected keys.

    Raises:
        ValueError: ``Can't find a valid checkpoint at {checkpoint_dir}`` when no weight file exists (HF's
            message).
        CheckpointLoadError: A weight file is truncated, corrupt or tampered with.
        ValueError: Not one stored tensor is a parameter of ``model`` (the weights of another model; HF warns and
            goes on with the model's initial weights).
        RuntimeError: ``strict=True`` and the keys do not match, or a tensor's shape differs (names the file).
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    unwrapped = _unwrap(model)
    safe_file = os.path.join(checkpoint_dir, SAFE_WEIGHTS_NAME)
    pickle_file = os.path.join(checkpoint_dir, WEIGHTS_NAME)
    if os.path.isfile(safe_file) or os.path.isfile(pickle_file):
        use_safe = os.path.isfile(safe_file)
        state_dict = _safetensors_load(safe_file) if use_safe else safe_torch_load(pickle_file)
        if not isinstance(state_dict, dict):
            raise CheckpointLoadError(pickle_file, "it does not hold a state dict")
        _refuse_foreign_weights(unwrapped, state_dict, checkpoint_dir)
        outcome = _load_state(unwrapped, state_dict, strict, safe_file if use_safe else pickle_file)
        result = WeightsLoadResult(list(outcome.missing_keys), list(outcome.unexpected_keys))
        loaded = list(state_dict)
        del state_dict
    else:
        for index_name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME):
            if os.path.isfile(os.path.join(checkpoint_dir, index_name)):
                result = _load_sharded(unwrapped, checkpoint_dir, index_name, strict)
                loaded = [key for key in unwrapped.state_dict() if key not in result.missing_keys]
                break
        else:
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint_dir}")
    _report_mismatch(unwrapped, loaded, result, checkpoint_dir)
    return result


def load_optimizer_and_scheduler(optimizer: Any, scheduler: Any, checkpoint_dir: str | os.PathLike) -> bool:
    """Restore optimizer and scheduler states from ``optimizer.pt`` and ``scheduler.pt``, as HF does on resume.

    Both files must exist, else neither is loaded (a ``save_only_model`` checkpoint has none). Both are read
    before either is applied, so a damaged file leaves both objects untouched.

    Args:
        optimizer: A ``torch.optim.Optimizer`` (state is moved to its parameters' devices on load).
        scheduler: An LR scheduler with ``load_state_dict``.
        checkpoint_dir: A checkpoint folder.

    Returns:
        True when both states were loaded, False when a file is missing.

    Raises:
        CheckpointLoadError: A file is truncated, corrupt or tampered with.
    """
    optimizer_file = os.path.join(checkpoint_dir, OPTIMIZER_NAME)
    scheduler_file = os.path.join(checkpoint_dir, SCHEDULER_NAME)
    if not (os.path.isfile(optimizer_file) and os.path.isfile(scheduler_file)):
        logger.info(
            "%s lacks %s or %s; optimizer and scheduler start fresh.", checkpoint_dir, OPTIMIZER_NAME, SCHEDULER_NAME
        )
        return False
    optimizer_state = safe_torch_load(optimizer_file)
    scheduler_state = safe_torch_load(scheduler_file)
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    return True


def load_scaler(scaler: Any, checkpoint_dir: str | os.PathLike) -> bool:
    """Restore a gradient scaler from ``scaler.pt`` when the checkpoint has one.

    Args:
        scaler: A ``torch.amp.GradScaler``.
        checkpoint_dir: A checkpoint folder.

    Returns:
        True when loaded, False when there is no ``scaler.pt``.

    Raises:
        CheckpointLoadError: The file is truncated, corrupt or tampered with.
    """
    path = os.path.join(checkpoint_dir, SCALER_NAME)
    if not os.path.isfile(path):
        return False
    scaler.load_state_dict(safe_torch_load(path))
    return True


class _Inert:
    """Stand-in for any object in a pickle: records constructor arguments and state, runs nothing."""

    _path = "?"

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj._args, obj._state, obj._items, obj._list = args, None, {}, []
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self._state = state

    def __setitem__(self, key, value):
        self._items[key] = value

    def append(self, value):
        self._list.append(value)

    def extend(self, values):
        self._list.extend(values)


class _InertUnpickler(pickle.Unpickler):
    """Decodes a pickle's data without importing a single module: every global becomes an :class:`_Inert`.

    The globals the data names are collected in :attr:`globals_seen`, to judge the file by.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.globals_seen: list[str] = []

    def find_class(self, module, name):
        self.globals_seen.append(f"{module}.{name}")
        return type(name.rsplit(".", 1)[-1], (_Inert,), {"_path": f"{module}.{name}"})

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("training arguments hold no tensors")


def _plain(value: Any) -> Any:
    """Turn decoded :class:`_Inert` objects into dicts / lists / scalars."""
    if isinstance(value, type) and issubclass(value, _Inert):
        return value._path
    if isinstance(value, _Inert):
        if value._path == "copyreg._reconstructor" and value._state is None:
            return None
        state = value._state
        if isinstance(state, tuple) and len(state) == 2:
            # (__dict__, __slots__ values) form of object state.
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            return {key: _plain(item) for key, item in state.items()}
        if value._items:
            return {key: _plain(item) for key, item in value._items.items()}
        if value._list:
            return [_plain(item) for item in value._list]
        if len(value._args) == 1:
            # Enums, torch.device and the like pickle as `Class(value)`.
            return _plain(value._args[0])
        return [_plain(item) for item in value._args]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    return value


# Modules whose names a pickled arguments object may reference (its class, enums, torch.device, accelerate's state).
_ARGS_PICKLE_MODULES = ("transformers.", "hf_lightning.", "accelerate.", "enum.", "collections.", "datetime.",
                        "pathlib.", "copyreg.")
_ARGS_PICKLE_BUILTINS = frozenset(
    f"builtins.{name}" for name in
    ("set", "frozenset", "dict", "list", "tuple", "object", "int", "float", "str", "bool", "complex", "bytes",
     "bytearray", "slice", "range")
)
# Modules no arguments object references; a class from them (e.g. subprocess.Popen) is as suspect as a function.
_DANGEROUS_MODULES = ("os", "posix", "nt", "subprocess", "sys", "builtins", "shutil", "socket", "importlib", "pty",
                      "runpy", "pickle", "marshal", "types", "ctypes", "code", "webbrowser", "io",
                      "multiprocessing", "threading", "signal", "tempfile", "pathlib", "urllib", "http")


def _unexpected_args_global(path: str) -> bool:
    """Whether a global named in a pickled arguments object is something no arguments object holds."""
    if path in _ARGS_PICKLE_BUILTINS or path == "torch.device":
        return False
    module, _, name = path.rpartition(".")
    if module.split(".")[0] in _DANGEROUS_MODULES and not path.startswith(("pathlib.Path", "pathlib.PosixPath",
                                                                           "pathlib.WindowsPath")):
        return True
    if module == "torch":
        return not isinstance(getattr(torch, name, None), torch.dtype)
    if path.startswith(_ARGS_PICKLE_MODULES):
        return False
    # A user's own subclass of TrainingArguments (a class, capitalised by convention) is fine; a function is not.
    return not name[:1].isupper()


def _read_pickled_args(path: str) -> dict[str, Any]:
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                member = next((name for name in archive.namelist() if name.endswith("data.pkl")), None)
                if member is None:
                    raise CheckpointLoadError(path, "it is not a torch.save archive (no data.pkl)")
                data = archive.read(member)
        else:
            with open(path, "rb") as f:
                data = f.read()
        unpickler = _InertUnpickler(io.BytesIO(data))
        decoded = _plain(unpickler.load())
    except CheckpointLoadError:
        raise
    except Exception as err:  # noqa: BLE001 - zip and pickle errors alike mean a damaged file
        raise CheckpointLoadError(path, f"the file is truncated or corrupt ({type(err).__name__})") from None
    suspect = [name for name in unpickler.globals_seen if _unexpected_args_global(name)]
    if suspect:
        # Nothing was run (every global was decoded as an inert stand-in); the file is refused all the same.
        raise CheckpointLoadError(
            path,
            f"it references `{suspect[0]}`, which training arguments never hold, so unpickling it could run "
            "arbitrary code (it was decoded without running anything)",
        )
    if not isinstance(decoded, dict):
        raise CheckpointLoadError(path, "it does not hold training arguments")
    # Match the JSON form: public fields only, secrets masked.
    return _mask_tokens({key: item for key, item in decoded.items() if not str(key).startswith("_")})


def load_training_args(checkpoint_dir: str | os.PathLike) -> dict[str, Any] | None:
    """Read the training arguments stored in a checkpoint as a dict of field values, never unpickling.

    ``training_args.json`` (written by :func:`save_training_args`) is preferred. A folder HF wrote only has the
    pickled ``training_args.bin``; it is decoded without importing or calling anything it names, enums become
    their values, private attributes are dropped and ``*_token`` fields masked as in HF's ``to_dict``.

    Args:
        checkpoint_dir: A checkpoint folder or a ``save_model`` output folder.

    Returns:
        ``{field: value}``, or None when the folder has neither file.

    Raises:
        CheckpointLoadError: The file is not valid JSON / not a readable ``torch.save`` archive.
    """
    json_path = os.path.join(checkpoint_dir, TRAINING_ARGS_JSON_NAME)
    if os.path.isfile(json_path):
        try:
            with open(json_path, encoding="utf-8") as f:
                values = json.load(f)
        except ValueError as err:
            raise CheckpointLoadError(json_path, f"it is not valid JSON ({err})") from err
        if not isinstance(values, dict):
            raise CheckpointLoadError(json_path, "it does not hold a JSON object of argument values")
        return values
    bin_path = os.path.join(checkpoint_dir, TRAINING_ARGS_NAME)
    if os.path.isfile(bin_path):
        return _read_pickled_args(bin_path)
    return None
