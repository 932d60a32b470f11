"""How a model's state is saved into and loaded from a checkpoint folder: the one part that differs by model kind.

:func:`~hf_lightning.checkpointing.writer.write_checkpoint` (through
:func:`~hf_lightning.checkpointing.writer.save_model_files`) and
:func:`~hf_lightning.checkpointing.reader.load_model_weights` never touch a model's tensors themselves: they call a
:class:`ModelState`, which has four steps, shaped for strategies that need collectives:

* :meth:`~ModelState.prepare` once before training, on the saving processes (a warm-up, writes nothing);
* :meth:`~ModelState.gather` at every save on **every** process, so a sharded model can run the collective that
  gathers its state dict (or write each process's shard into the folder, as each process writes its RNG file);
* :meth:`~ModelState.write` at every save on the saving process only, with what ``gather`` returned;
* :meth:`~ModelState.load` on every process, reading the folder back into the model.

The optimizer's state goes to ``optimizer.pt`` through ``optimizer_state`` (every process; the saving process
writes it); a kind with a ``save_optimizer(model, optimizer, folder, should_save)`` method (FSDP2's) writes its own
optimizer files instead, called on every process.

:class:`PlainModelState` is the default: a model with ``save_pretrained`` saves itself, any other module as
``model.safetensors`` (tied weights as separate copies); it loads ``model.safetensors``, ``pytorch_model.bin`` and
sharded indexes of either. :class:`PeftModelState` is chosen for a PEFT model (:func:`model_state_for`): it saves
the same way (a ``PeftModel`` writes its adapters only) and loads the adapter weights into the wrapped model.

A new kind plugs in without touching the writer, the reader or rotation: implement the four methods, pass an
instance as ``CheckpointContents(model_state=...)`` when writing and ``load_model_weights(..., model_state=...)``
when reading, and, if it writes a weight layout :func:`~hf_lightning.checkpointing.completeness.has_model_weights`
does not know yet, add that layout there (adapters and ``pytorch_model_fsdp*`` are known). For example:

* PEFT adapters (:class:`PeftModelState`): ``write`` calls the adapter model's ``save_pretrained``
  (``adapter_model.safetensors`` and ``adapter_config.json``), ``load`` reads the adapter weights only into the
  wrapped model;
* FSDP2 (:class:`FSDP2ModelState`, chosen for a model sharded by ``fully_shard``), in HF's FSDP layout. Full
  state: ``gather`` runs the full-state-dict all-gather (offloaded to CPU, on every process) and returns the dict
  on the saving process, ``write`` stores it as ``model.safetensors`` and ``pytorch_model_fsdp.bin``; the optimizer
  (``save_optimizer``) as ``optimizer.bin``. Sharded state: ``gather`` writes this process's shard under
  ``pytorch_model_fsdp_0/`` in the folder it is given, ``save_optimizer`` under ``optimizer_0/``, ``write`` writes
  what only one process writes (the config); ``load`` reads the shards collectively.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import safetensors.torch
import torch

from hf_lightning._utils import unwrap_model
from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.layout import ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME, DCP_METADATA_NAME
from hf_lightning.checkpointing.layout import FSDP_FULL_WEIGHTS_NAME, FSDP_OPTIMIZER_NAME, FSDP_SHARDED_MODEL_DIR
from hf_lightning.checkpointing.layout import FSDP_SHARDED_OPTIMIZER_DIR
from hf_lightning.checkpointing.layout import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from hf_lightning.checkpointing.layout import WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from hf_lightning.checkpointing.safe_load import load_safetensors, safe_torch_load, verify_dcp_metadata

__all__ = [
    "FSDP2ModelState",
    "ModelState",
    "PeftModelState",
    "PlainModelState",
    "WeightsLoadResult",
    "apply_optimizer_state",
    "gather_optimizer_state",
    "is_fsdp2_model",
    "is_peft_model",
    "load_optimizer_files",
    "model_state_for",
    "prepare_model_saving",
    "saved_as_whole",
    "WrittenBy",
]

logger = logging.getLogger(__name__)


class WeightsLoadResult(NamedTuple):
    """Keys that did not match when loading weights (as ``nn.Module.load_state_dict`` reports them)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class ModelState(Protocol):
    """How one kind of model is saved into and loaded from a checkpoint folder (see the module docstring)."""

    def prepare(self, model: torch.nn.Module) -> None:
        """Build ahead of training what the first save would otherwise build (writes nothing).

        Args:
            model: The model that will be saved, possibly wrapped (DDP) under ``.module``.
        """

    def gather(self, model: torch.nn.Module, folder: str) -> Any:
        """Run on every process at every save: collect what :meth:`write` needs.

        Args:
            model: The model, possibly wrapped under ``.module``.
            folder: The (temporary) checkpoint folder being written, for a kind whose every process writes a part.

        Returns:
            Whatever :meth:`write` takes on the saving process.
        """

    def write(self, gathered: Any, folder: str) -> None:
        """Run on the saving process only: write the model's files into ``folder`` (it exists).

        Args:
            gathered: What :meth:`gather` returned on this process.
            folder: The destination folder.
        """

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        """Load the weights stored in ``folder`` into ``model``.

        Args:
            model: The model, possibly wrapped under ``.module``.
            folder: A checkpoint folder or a ``save_model`` output folder.
            strict: Raise when keys do not match, as ``load_state_dict(strict=True)``.

        Returns:
            The missing and unexpected keys.
        """

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Run on every process at every save: the optimizer's state for ``optimizer.pt`` (``None``: not here).

        Args:
            model: The model the optimizer trains, possibly wrapped under ``.module``.
            optimizer: The optimizer.

        Returns:
            On the saving process, the dict to store (``Optimizer.state_dict()``'s form).
        """
        return optimizer.state_dict()

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Run on every process: load ``state`` (read from ``optimizer.pt``) into ``optimizer``."""
        optimizer.load_state_dict(state)

    def check_loadable(self, model: torch.nn.Module) -> None:
        """Before the first step, on every process: raise if what :meth:`write` writes could not be loaded back.

        Called when the run will load a checkpoint it writes (``load_best_model_at_end``), so that failure
        comes before training instead of after it.

        Args:
            model: The model, possibly wrapped under ``.module``.

        Raises:
            ValueError: The checkpoints would hold no weights :meth:`load` reads (names the fix).
        """


class WrittenBy:
    """Another :class:`ModelState` whose files are written by a function instead (a ``Trainer`` subclass's
    ``save_model`` / ``_save``, which HF's ``_save_checkpoint`` calls for every checkpoint); loading and the checks
    are the wrapped kind's.

    As in HF, the function runs on **every** process, in the :meth:`gather` step: HF's ``_save_checkpoint`` calls
    ``save_model`` on every process, which under FSDP gathers the full state dict (a collective) and then calls
    ``_save(folder, state_dict=...)`` everywhere (HF's own ``_save`` writes on the saving process only). A sharded
    model's gather thus meets on every process, whatever the override does around it; :meth:`write` writes nothing
    more.

    Args:
        base: The model's own kind (loading, checks).
        write_model: ``write_model(folder)`` writes the model's files into ``folder``; called on every process.
    """

    def __init__(self, base: ModelState, write_model: Callable[[str], None]) -> None:
        self.base = base
        self.write_model = write_model

    def prepare(self, model: torch.nn.Module) -> None:
        self.base.prepare(model)

    def gather(self, model: torch.nn.Module, folder: str) -> Any:
        self.write_model(folder)
        # Under FSDP, HF's checkpoint also gets accelerate's files (save_fsdp_model), whatever save_model wrote.
        return self.base.gather(model, folder) if isinstance(self.base, FSDP2ModelState) else None

    def write(self, gathered: Any, folder: str) -> None:
        """Nothing more than the FSDP files (:meth:`gather` wrote the model's files)."""
        if gathered is not None:
            self.base.write_fsdp_files(gathered, folder)

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        return self.base.load(model, folder, strict)

    def __getattr__(self, name: str) -> Any:
        # The optimizer steps (save_optimizer, optimizer_state, load_optimizer_state) are the wrapped kind's.
        if name in ("save_optimizer", "optimizer_state", "load_optimizer_state"):
            return getattr(self.base, name)
        raise AttributeError(name)

    def check_loadable(self, model: torch.nn.Module) -> None:
        self.base.check_loadable(model)


# ---- the plain kind: writing -----------------------------------------------------------------------------------


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


# ---- the plain kind: loading -----------------------------------------------------------------------------------


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
        state_dict = load_safetensors(shard_path) if safe else safe_torch_load(shard_path)
        _load_state(model, state_dict, False, shard_path)
        del state_dict
    return result




class PlainModelState(ModelState):
    """The model's state as HF's Trainer saves and loads an unsharded model (the default :class:`ModelState`).

    Writing, as HF's ``Trainer._save``: a model with ``save_pretrained`` (a ``PreTrainedModel``, possibly wrapped
    under ``.module``) saves itself: ``config.json``, ``generation_config.json`` when it has one,
    ``model.safetensors`` (sharded with an index when large). Any other module gets its ``state_dict`` in
    ``model.safetensors`` with metadata ``{"format": "pt"}``; tensors sharing memory (tied weights) are stored as
    separate copies, where HF fails.

    Loading, as HF's ``_load_from_checkpoint`` (on CPU first): ``model.safetensors``, ``pytorch_model.bin`` (read
    with ``weights_only=True``), then a sharded ``model.safetensors.index.json`` or
    ``pytorch_model.bin.index.json``. Missing / unexpected keys are logged as warnings (a tied weight that is not
    stored, such as GPT-2's ``lm_head.weight``, is not reported).
    """

    def prepare(self, model: torch.nn.Module) -> None:
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
        unwrapped = unwrap_model(model)
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

    def gather(self, model: torch.nn.Module, folder: str) -> torch.nn.Module:
        """Nothing to gather: every tensor is on the saving process already. Returns the unwrapped model."""
        return unwrap_model(model)

    def write(self, gathered: torch.nn.Module, folder: str) -> None:
        """Write the model's files into ``folder`` (see the class docstring)."""
        save_pretrained = getattr(gathered, "save_pretrained", None)
        if callable(save_pretrained):
            # transformers 4.x still takes `safe_serialization`; 5.x always writes safetensors and has no such keyword.
            kwargs = {"safe_serialization": True} if _accepts_keyword(save_pretrained, "safe_serialization") else {}
            save_pretrained(folder, **kwargs)
        else:
            safetensors.torch.save_file(
                _standalone_tensors(gathered.state_dict()),
                os.path.join(folder, SAFE_WEIGHTS_NAME),
                metadata={"format": "pt"},
            )

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """``optimizer.state_dict()``: every process holds the whole state."""
        return optimizer.state_dict()

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """``optimizer.load_state_dict(state)``."""
        optimizer.load_state_dict(state)

    def check_loadable(self, model: torch.nn.Module) -> None:
        """Refuse, before training, a model whose checkpoints :meth:`load` could not read back.

        Two cases: a transformers model given adapters by its own ``add_adapter`` / ``load_adapter`` (not a
        ``PeftModel``): its ``save_pretrained`` writes the adapters only, which HF's Trainer fails to load after
        training as well; and a ``save_pretrained`` that is neither transformers' nor peft's, which is run once into
        a temporary folder to see the files it writes (a sharded ``model.safetensors.index.json`` or
        ``pytorch_model.bin`` is fine; other names are refused).

        Raises:
            ValueError: Names the files and the fix (wrap with ``peft.get_peft_model``, write one of the known
                names, or set ``load_best_model_at_end=False``).
        """
        unwrapped = unwrap_model(model)
        name = type(unwrapped).__name__
        if getattr(unwrapped, "_hf_peft_config_loaded", False):
            raise ValueError(
                f"load_best_model_at_end=True cannot load the best checkpoint of this {name}: it holds PEFT adapters "
                "added with transformers' add_adapter/load_adapter, so its save_pretrained writes "
                f"{ADAPTER_SAFE_WEIGHTS_NAME} only, which HF's Trainer does not load back into such a model either. "
                "Wrap the base model with peft.get_peft_model(model, config) instead, or set "
                "load_best_model_at_end=False."
            )
        save_pretrained = getattr(type(unwrapped), "save_pretrained", None)
        if not callable(save_pretrained) or getattr(save_pretrained, "__module__", "").split(".")[0] in (
                "transformers", "peft"):
            return
        with tempfile.TemporaryDirectory(prefix="hf-lightning-save-probe-") as probe:
            self.write(self.gather(model, probe), probe)
            written = sorted(os.listdir(probe))
        if not set(written) & {SAFE_WEIGHTS_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME}:
            raise ValueError(
                f"load_best_model_at_end=True cannot load the best checkpoint of this {name}: its save_pretrained "
                f"writes {written}, and checkpoints are loaded from {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} or a "
                f"sharded {SAFE_WEIGHTS_INDEX_NAME} / {WEIGHTS_INDEX_NAME} (as HF's Trainer does). Make "
                "save_pretrained write one of those, or set load_best_model_at_end=False."
            )

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        """Load ``folder``'s weights into ``model`` (see the class docstring).

        Raises:
            ValueError: ``Can't find a valid checkpoint at {folder}`` when no weight file exists (HF's message).
            CheckpointLoadError: A weight file is truncated, corrupt or tampered with.
            ValueError: Not one stored tensor is a parameter of ``model`` (the weights of another model; HF warns
                and goes on with the model's initial weights).
            RuntimeError: ``strict=True`` and the keys do not match, or a tensor's shape differs (names the file).
        """
        unwrapped = unwrap_model(model)
        safe_file = os.path.join(folder, SAFE_WEIGHTS_NAME)
        pickle_file = os.path.join(folder, WEIGHTS_NAME)
        if not os.path.isfile(pickle_file) and os.path.isfile(os.path.join(folder, FSDP_FULL_WEIGHTS_NAME)):
            pickle_file = os.path.join(folder, FSDP_FULL_WEIGHTS_NAME)  # HF's FSDP FULL_STATE_DICT file
        if os.path.isfile(safe_file) or os.path.isfile(pickle_file):
            use_safe = os.path.isfile(safe_file)
            state_dict = load_safetensors(safe_file) if use_safe else safe_torch_load(pickle_file)
            if not isinstance(state_dict, dict):
                raise CheckpointLoadError(pickle_file, "it does not hold a state dict")
            _refuse_foreign_weights(unwrapped, state_dict, folder)
            outcome = _load_state(unwrapped, state_dict, strict, safe_file if use_safe else pickle_file)
            result = WeightsLoadResult(list(outcome.missing_keys), list(outcome.unexpected_keys))
            loaded = list(state_dict)
            del state_dict
        else:
            for index_name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME):
                if os.path.isfile(os.path.join(folder, index_name)):
                    result = _load_sharded(unwrapped, folder, index_name, strict)
                    loaded = [key for key in unwrapped.state_dict() if key not in result.missing_keys]
                    break
            else:
                if not os.path.isdir(os.path.join(folder, FSDP_SHARDED_MODEL_DIR)):
                    raise ValueError(f"Can't find a valid checkpoint at {folder}")
                # HF's FSDP SHARDED_STATE_DICT folder: torch.distributed.checkpoint reads it into one process.
                return _load_dcp_model(unwrapped, folder)
        _report_mismatch(unwrapped, loaded, result, folder)
        return result


# ---- the PEFT kind ---------------------------------------------------------------------------------------------


def is_peft_model(model: torch.nn.Module) -> bool:
    """Tell, without importing ``peft``, whether ``model`` (possibly wrapped under ``.module``) is a ``PeftModel``.

    A ``PeftModel`` has a ``peft_config`` dict, an ``active_adapters`` list (a property) and ``load_adapter``. A
    transformers model with an adapter added by ``add_adapter`` is not one (its ``active_adapters`` is a method),
    as for HF's Trainer.
    """
    unwrapped = unwrap_model(model)
    return (
        isinstance(getattr(unwrapped, "peft_config", None), dict)
        and isinstance(getattr(unwrapped, "active_adapters", None), (list, tuple))
        and callable(getattr(unwrapped, "load_adapter", None))
    )


def _adapter_files_in(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME))


class PeftModelState(PlainModelState):
    """A PEFT model's state (``peft.PeftModel``, recognised by :func:`is_peft_model`), as HF's Trainer handles it.

    Writing is the plain kind's: the ``PeftModel``'s own ``save_pretrained`` writes the adapters only,
    ``adapter_model.safetensors`` and ``adapter_config.json`` (plus its ``README.md``); one sub-folder per further
    adapter.

    Loading, as HF's ``_load_from_checkpoint``: a folder holding full weights (``model.safetensors`` /
    ``pytorch_model.bin``) is loaded as the plain kind loads it. Otherwise the adapter weights are loaded into the
    wrapped model with its own ``load_adapter``, under the first active adapter's name (a warning when several are
    active) and trainable. With one adapter per sub-folder (several adapters), the top-level adapter is loaded as
    ``"default"`` and each sub-folder under its name, the active one trainable, and the active adapter is set again.
    A folder with no adapter weights falls back to the plain kind (sharded full weights, or HF's "Can't find a valid
    checkpoint"). The best model at the end is loaded by the same rules (HF's ``_load_best_model`` reads only the
    top-level adapter; the two differ only for several adapters).
    """

    def check_loadable(self, model: torch.nn.Module) -> None:
        """Nothing to refuse: a ``PeftModel`` writes its adapters and loads them back with its ``load_adapter``."""

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        """Load ``folder``'s adapter (or full) weights into the PEFT model (see the class docstring).

        Raises:
            ValueError: ``Can't find a valid checkpoint at {folder}`` when no weight file exists (HF's message).
            RuntimeError: ``strict=True`` and adapter keys are missing or unexpected.
        """
        unwrapped = unwrap_model(model)
        if any(os.path.isfile(os.path.join(folder, name)) for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME)):
            return super().load(model, folder, strict)
        subdirs = [
            name for name in sorted(os.listdir(folder))
            if os.path.isdir(os.path.join(folder, name)) and _adapter_files_in(os.path.join(folder, name))
        ]
        if not subdirs and not _adapter_files_in(folder):
            return super().load(model, folder, strict)
        active_adapters = list(unwrapped.active_adapters)
        if len(active_adapters) > 1:
            logger.warning("Several adapters are active (%s); only the first is loaded as trainable.", active_adapters)
        active = active_adapters[0]
        outcomes = []
        if subdirs:
            if _adapter_files_in(folder):
                outcomes.append(unwrapped.load_adapter(folder, "default", is_trainable=active == "default"))
            for name in subdirs:
                outcomes.append(unwrapped.load_adapter(os.path.join(folder, name), name, is_trainable=name == active))
            unwrapped.set_adapter(active)
        else:
            outcomes.append(unwrapped.load_adapter(folder, active, is_trainable=True))
        result = WeightsLoadResult(
            [key for outcome in outcomes for key in getattr(outcome, "missing_keys", ())],
            [key for outcome in outcomes for key in getattr(outcome, "unexpected_keys", ())],
        )
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(
                f"The adapter checkpoint at {folder} does not match {type(unwrapped).__name__}: missing keys "
                f"{result.missing_keys}, unexpected keys {result.unexpected_keys}. Pass strict=False to load anyway."
            )
        if result.missing_keys:
            logger.warning("Adapter keys missing from the checkpoint at %s (kept as initialised): %s", folder,
                           result.missing_keys)
        if result.unexpected_keys:
            logger.warning("Keys in the adapter checkpoint at %s that the model does not have (ignored): %s", folder,
                           result.unexpected_keys)
        return result


# ---- the FSDP2 kind ---------------------------------------------------------------------------------------------


def is_fsdp2_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (possibly under ``.module``) was sharded with FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed support
        return False
    return isinstance(unwrap_model(model), FSDPModule)


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def _dcp_folder(folder: str, name: str) -> str:
    """``folder/name``, a torch.distributed.checkpoint folder, refused unless complete (its ``.metadata``) and
    its ``.metadata`` names nothing but checkpoint metadata (torch unpickles it freely)."""
    path = os.path.join(folder, name)
    metadata = os.path.join(path, DCP_METADATA_NAME)
    if not os.path.isfile(metadata):
        raise CheckpointLoadError(path, f"it has no {DCP_METADATA_NAME}, so its save did not finish")
    verify_dcp_metadata(metadata)
    return path


def _dcp_load(state: dict, path: str) -> None:
    """``torch.distributed.checkpoint.load`` into ``state`` (in place), with every non-tensor value read with
    ``weights_only=True`` (torch's default planner unpickles them freely)."""
    import torch.distributed.checkpoint as dcp

    class SafeLoadPlanner(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            data = value.getvalue()
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except Exception:  # noqa: BLE001 - a value that is not plain data is refused unread
                raise CheckpointLoadError(path, f"its entry {read_item.dest_index.fqn!r} holds objects other than "
                                                "tensors and plain values, so loading it was refused") from None
            super().load_bytes(read_item, io.BytesIO(data))

    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), planner=SafeLoadPlanner())
    except dcp.CheckpointException as err:
        # torch wraps every process's failure; a refused entry is raised as itself on every process.
        for failure, _ in err.failures.values():
            if isinstance(failure, CheckpointLoadError):
                raise failure from None
        raise


def _load_dcp_model(model: torch.nn.Module, folder: str) -> WeightsLoadResult:
    """Read ``pytorch_model_fsdp_0/`` (HF's SHARDED_STATE_DICT model, stored as ``{"model": state_dict}``) into
    ``model``: each process reads its shard of a sharded model, one process the whole of an unsharded one."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    path = _dcp_folder(folder, FSDP_SHARDED_MODEL_DIR)
    state = {"model": get_model_state_dict(model)}
    _dcp_load(state, path)
    set_model_state_dict(model, state["model"])
    return WeightsLoadResult([], [])


def load_optimizer_files(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> bool:
    """Load HF's FSDP optimizer files, if ``folder`` has them, into ``optimizer`` (sharded by FSDP2 or not).

    ``optimizer_0/`` (SHARDED_STATE_DICT, ``{"optimizer": ...}`` in torch.distributed.checkpoint's format; each
    process reads its shard) or ``optimizer.bin`` (FULL_STATE_DICT: the full state keyed by parameter name, read on
    every process). Call it on every process (collective under FSDP2).

    Returns:
        False when the folder has neither (``optimizer.pt`` is then the plain file to read).
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    unwrapped = unwrap_model(model)
    if os.path.isdir(os.path.join(folder, FSDP_SHARDED_OPTIMIZER_DIR)):
        path = _dcp_folder(folder, FSDP_SHARDED_OPTIMIZER_DIR)
        state = {"optimizer": get_optimizer_state_dict(unwrapped, optimizer)}
        _dcp_load(state, path)
        set_optimizer_state_dict(unwrapped, optimizer, state["optimizer"])
        return True
    path = os.path.join(folder, FSDP_OPTIMIZER_NAME)
    if not os.path.isfile(path):
        return False
    state = safe_torch_load(path)
    if not isinstance(state, dict) or "state" not in state or "param_groups" not in state:
        raise CheckpointLoadError(path, "it does not hold an optimizer state")
    set_optimizer_state_dict(unwrapped, optimizer, state, options=_options())
    return True


_CHECKPOINT_LAYOUTS = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


class FSDP2ModelState(PlainModelState):
    """An FSDP2 model's state in the ``checkpoint-N`` layout of HF's FSDP run (accelerate's ``save_fsdp_model`` /
    ``save_fsdp_optimizer``, FSDP2, ``use_dcp=True``), chosen by ``fsdp_config["state_dict_type"]``:

    * ``FULL_STATE_DICT`` (the default): the full weights gathered onto the saving process, written as
      ``model.safetensors`` (``save_pretrained``, what HF's ``save_model`` writes) and ``pytorch_model_fsdp.bin``
      (``torch.save`` of the full state dict), and the full optimizer state keyed by parameter name as
      ``optimizer.bin``;
    * ``SHARDED_STATE_DICT``: no gathering; every process writes its shard of the model into
      ``pytorch_model_fsdp_0/`` and of the optimizer into ``optimizer_0/`` (torch.distributed.checkpoint folders
      holding ``{"model": ...}`` / ``{"optimizer": ...}``; a collective save); only ``config.json`` besides.

    Loading takes whichever layout the folder has, so each layout resumes under the other, in one process and in a
    folder an unsharded run wrote: ``pytorch_model_fsdp_0/`` (each process reads its shard),
    ``pytorch_model_fsdp.bin``, ``model.safetensors`` or ``pytorch_model.bin`` (read whole on every process).

    Args:
        state_dict_type: ``"FULL_STATE_DICT"`` or ``"SHARDED_STATE_DICT"``.
    """

    def __init__(self, state_dict_type: str = "FULL_STATE_DICT") -> None:
        if state_dict_type not in _CHECKPOINT_LAYOUTS:
            raise ValueError(f"FSDP2ModelState(state_dict_type={state_dict_type!r}): use one of {_CHECKPOINT_LAYOUTS}.")
        self.state_dict_type = state_dict_type

    @property
    def sharded(self) -> bool:
        return self.state_dict_type == "SHARDED_STATE_DICT"

    def prepare(self, model: torch.nn.Module) -> None:
        """Nothing to warm up (the plain kind's warm-up reads the model's config only)."""
        super().prepare(model)

    def gather(self, model: torch.nn.Module, folder: str) -> tuple[torch.nn.Module, dict | None, dict | None]:
        """Every process. FULL: all-gather the full state dict onto the CPU (rank 0 gets it). SHARDED: write this
        process's shard into ``folder/pytorch_model_fsdp_0`` (the folder must be the same path on every process).

        Returns:
            ``(model, weights for save_pretrained or None, full state dict or None)``.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        unwrapped = unwrap_model(model)
        if self.sharded:
            import torch.distributed.checkpoint as dcp

            dcp.save({"model": get_model_state_dict(unwrapped)},
                     storage_writer=dcp.FileSystemWriter(os.path.join(folder, FSDP_SHARDED_MODEL_DIR)))
            return unwrapped, None, None
        state_dict = get_model_state_dict(unwrapped, options=_options(cpu_offload=True))
        # As HF's FSDP run, save_pretrained gets the whole gathered dict: it leaves out only tensors sharing memory,
        # so a tied weight (GPT-2's lm_head shares wte) gathered as a copy of its own (on several processes) is
        # stored a second time. A shallow copy, since save_pretrained empties the dict it is given.
        return unwrapped, dict(state_dict), state_dict

    def write(self, gathered: tuple[torch.nn.Module, dict | None, dict | None], folder: str) -> None:
        """The saving process: FULL: ``save_pretrained(folder, state_dict=...)`` (else ``model.safetensors``) and
        ``pytorch_model_fsdp.bin``; SHARDED: ``config.json`` only (the shards are written)."""
        model, state_dict, _ = gathered
        if state_dict is None:
            config = getattr(model, "config", None)
            if callable(getattr(config, "save_pretrained", None)):
                config.save_pretrained(folder)
        else:
            save_pretrained = getattr(model, "save_pretrained", None)
            if callable(save_pretrained):
                save_pretrained(folder, state_dict=state_dict)
            else:
                safetensors.torch.save_file(_standalone_tensors(state_dict), os.path.join(folder, SAFE_WEIGHTS_NAME),
                                            metadata={"format": "pt"})
        self.write_fsdp_files(gathered, folder)

    def write_fsdp_files(self, gathered: tuple[torch.nn.Module, dict | None, dict | None], folder: str) -> None:
        """The saving process: what accelerate's ``save_fsdp_model`` adds, ``pytorch_model_fsdp.bin`` (FULL; the
        SHARDED folder was written in :meth:`gather`)."""
        full = gathered[2]
        if full is not None:
            torch.save(full, os.path.join(folder, FSDP_FULL_WEIGHTS_NAME))

    def check_loadable(self, model: torch.nn.Module) -> None:
        """Nothing to refuse: both layouts are loaded back by :meth:`load`."""

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        """Read ``folder``'s weights on every process into the shards (see the class docstring).

        Raises:
            ValueError: ``Can't find a valid checkpoint at {folder}`` when no weight file exists (HF's message).
            CheckpointLoadError: ``pytorch_model_fsdp_0/`` has no ``.metadata`` (an unfinished save).
            RuntimeError: ``strict=True`` and the keys do not match.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        unwrapped = unwrap_model(model)
        if os.path.isdir(os.path.join(folder, FSDP_SHARDED_MODEL_DIR)):
            return _load_dcp_model(unwrapped, folder)
        for name in (FSDP_FULL_WEIGHTS_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                break
        else:
            raise ValueError(f"Can't find a valid checkpoint at {folder}")
        state_dict = load_safetensors(path) if name == SAFE_WEIGHTS_NAME else safe_torch_load(path)
        if not isinstance(state_dict, dict):
            raise CheckpointLoadError(path, "it does not hold a state dict")
        # The keys of the model's state dict (its sharded form has the same keys and gathers nothing).
        names = set(get_model_state_dict(unwrapped))
        # A tied weight (GPT-2's lm_head shares wte) is stored once: give it the tensor it shares.
        for key in names - set(state_dict):
            tied = _tied_source(unwrapped, key)
            if tied in state_dict:
                state_dict[key] = state_dict[tied]
        result = WeightsLoadResult(sorted(names - set(state_dict)), sorted(set(state_dict) - names))
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(
                f"Cannot load the weights at {folder} into {type(unwrapped).__name__}: missing keys "
                f"{result.missing_keys}, unexpected keys {result.unexpected_keys}."
            )
        set_model_state_dict(unwrapped, {k: v for k, v in state_dict.items() if k in names},
                             options=_options(strict=False))
        return result

    # ---- the optimizer ---------------------------------------------------------------------------------------

    def save_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str,
                       should_save: bool) -> None:
        """Every process: SHARDED: write this process's shard into ``folder/optimizer_0``; FULL: gather the full
        state (keyed by parameter name), written as ``optimizer.bin`` by the saving process."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        unwrapped = unwrap_model(model)
        if self.sharded:
            import torch.distributed.checkpoint as dcp

            dcp.save({"optimizer": get_optimizer_state_dict(unwrapped, optimizer)},
                     storage_writer=dcp.FileSystemWriter(os.path.join(folder, FSDP_SHARDED_OPTIMIZER_DIR)))
            return
        full = get_optimizer_state_dict(unwrapped, optimizer, options=_options(cpu_offload=True))
        if should_save:
            torch.save(full, os.path.join(folder, FSDP_OPTIMIZER_NAME))

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """The full optimizer state in ``Optimizer.state_dict()``'s form (every process; rank 0 gets it)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = get_optimizer_state_dict(unwrap_model(model), optimizer, options=_options(cpu_offload=True))
        if not full:
            return None
        index = {}
        groups = []
        for group in full["param_groups"]:
            ids = []
            for name in group["params"]:
                index[name] = len(index)
                ids.append(index[name])
            groups.append({**group, "params": ids})
        return {"state": {index[name]: value for name, value in full["state"].items()}, "param_groups": groups}

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a full ``Optimizer.state_dict()``-form state (every process); each process keeps its shard."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        unwrapped = unwrap_model(model)
        # The optimizer's own parameter names, in its order (the same numbering the file uses).
        current = get_optimizer_state_dict(unwrapped, optimizer, options=_options())
        names = [name for group in current["param_groups"] for name in group["params"]]
        saved_groups = state["param_groups"]
        if len(saved_groups) != len(current["param_groups"]) or \
                sum(len(g["params"]) for g in saved_groups) != len(names):
            raise ValueError(
                "The optimizer state in the checkpoint does not match this optimizer (different parameter groups): "
                "resume with the same model and optimizer arguments."
            )
        position = {}
        for group in saved_groups:
            for pid in group["params"]:
                position[pid] = len(position)
        by_name = {
            "state": {names[position[pid]]: value for pid, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[position[pid]] for pid in group["params"]]}
                             for group in saved_groups],
        }
        set_optimizer_state_dict(unwrapped, optimizer, by_name, options=_options())


def _tied_source(model: torch.nn.Module, key: str) -> str | None:
    """The name under which the parameter ``key`` shares its tensor with another parameter (tied weights)."""
    try:
        target = model.get_parameter(key)
    except AttributeError:
        return None
    for name, param in model.named_parameters(remove_duplicate=False):
        if param is target and name != key:
            return name
    return None


class TensorParallelModelState(FSDP2ModelState):
    """A model transformers loaded tensor-parallel (DTensor parameters, ``parallelism_config.tp_size``): gathered
    and loaded as FSDP2's full state. Written by its ``save_pretrained`` as a whole model: with the model's
    ``config.distributed_config`` in place, transformers' save gathers the shards itself and ends in a barrier
    every process must reach, but only the saving process writes."""

    #: The optimizer is saved as for an unsharded run (``optimizer.pt``), not in HF's FSDP files.
    save_optimizer = None

    def write(self, gathered: tuple[torch.nn.Module, dict | None, dict | None], folder: str) -> None:
        """``save_pretrained`` with the gathered weights only (no FSDP files: this is not an FSDP run)."""
        model, state_dict, _ = gathered
        with saved_as_whole(model):
            super().write((model, state_dict, None), folder)


@contextlib.contextmanager
def saved_as_whole(model: torch.nn.Module) -> Iterator[None]:
    """Let the saving process alone call ``model.save_pretrained(state_dict=<gathered weights>)`` on a model
    transformers loaded distributed: without its ``config.distributed_config`` for the call, transformers neither
    gathers nor waits at its closing barrier for the processes that do not save."""
    config = getattr(model, "config", None)
    distributed = getattr(config, "distributed_config", None)
    if distributed is not None:
        config.distributed_config = None
    try:
        yield
    finally:
        if distributed is not None:
            config.distributed_config = distributed


def _has_dtensor_parameters(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "device_mesh") for p in unwrap_model(model).parameters())


def model_state_for(model: torch.nn.Module, state_dict_type: str = "FULL_STATE_DICT") -> ModelState:
    """The :class:`ModelState` for ``model``: :class:`PeftModelState` for a PEFT model, ``FSDP2ModelState`` for a
    model sharded by FSDP2 (:class:`FSDP2ModelState`), else the plain kind.

    Args:
        model: The model, possibly wrapped under ``.module``.
        state_dict_type: For an FSDP2 model, the checkpoint layout (``fsdp_config["state_dict_type"]``).
    """
    if is_fsdp2_model(model):
        return FSDP2ModelState(state_dict_type)
    if _has_dtensor_parameters(model):
        return TensorParallelModelState()
    return PeftModelState() if is_peft_model(model) else PlainModelState()


def gather_optimizer_state(model_state: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """``model_state.optimizer_state(model, optimizer)``, or ``optimizer.state_dict()`` for a kind without it
    (a ``ModelState`` written before the optimizer steps existed). Every process calls it at every save."""
    method = getattr(model_state, "optimizer_state", None)
    return optimizer.state_dict() if method is None else method(model, optimizer)


def apply_optimizer_state(model_state: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                          state: dict) -> None:
    """``model_state.load_optimizer_state(...)``, or ``optimizer.load_state_dict(state)`` for a kind without it."""
    method = getattr(model_state, "load_optimizer_state", None)
    if method is None:
        optimizer.load_state_dict(state)
    else:
        method(model, optimizer, state)


def prepare_model_saving(model: torch.nn.Module, model_state: ModelState | None = None) -> None:
    """Run ``model_state``'s warm-up before training (see :meth:`PlainModelState.prepare`, the default).

    Args:
        model: The model that will be saved, possibly wrapped (DDP) under ``.module``.
        model_state: How the model is saved; the one :func:`model_state_for` chooses when None.
    """
    (model_state or model_state_for(model)).prepare(model)
