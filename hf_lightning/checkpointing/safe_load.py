"""What may be unpickled from a checkpoint, and how: loading its files without running code they could name.

* ``torch.save`` files go through :func:`safe_torch_load` (``weights_only=True``, widened only by the globals a
  caller names, such as the NumPy types of an RNG file: :func:`rng_safe_globals`); safetensors files through
  :func:`load_safetensors`. A damaged or tampered file raises :class:`CheckpointLoadError` naming the file.
* The pickled ``training_args.bin`` HF writes is never unpickled: :func:`load_training_args` reads
  ``training_args.json`` or decodes the pickle with an unpickler that imports and runs nothing.
* :func:`verify_checkpoint_files` judges every file of a folder this way before a resume applies any of them.
* The ``.metadata`` of a torch.distributed.checkpoint folder (HF's FSDP ``pytorch_model_fsdp_0/``), which torch
  unpickles freely, is judged first by :func:`verify_dcp_metadata` (decoded without importing anything).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy as np
import safetensors.torch
import torch

from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.layout import (
    DCP_METADATA_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_PREFIX,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_JSON_NAME,
    TRAINING_ARGS_NAME,
    checkpoint_step,
)

__all__ = [
    "load_safetensors",
    "load_training_args",
    "mask_tokens",
    "rng_safe_globals",
    "safe_torch_load",
    "verify_checkpoint_files",
    "verify_dcp_metadata",
]


# ---- torch.save and safetensors files ---------------------------------------------------------------------------


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


def _weights_only_load(path: str | os.PathLike, extra_safe_globals: Iterable[Any] | None, **load_kwargs: Any) -> Any:
    """``torch.load(weights_only=True)`` widened by ``extra_safe_globals``; any failure as a CheckpointLoadError."""
    try:
        if extra_safe_globals:
            with torch.serialization.safe_globals(list(extra_safe_globals)):
                return torch.load(path, weights_only=True, **load_kwargs)
        return torch.load(path, weights_only=True, **load_kwargs)
    except Exception as err:  # noqa: BLE001 - every failure mode of a damaged file ends in the same advice
        # `from None`: torch's own message recommends turning safe loading off, which we never want to show.
        raise CheckpointLoadError(path, _describe_load_failure(err)) from None


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
    return _weights_only_load(path, extra_safe_globals, map_location=map_location)


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Read a safetensors file to the CPU, raising :class:`CheckpointLoadError` for a truncated or corrupt one."""
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for every corrupt layout
        raise CheckpointLoadError(path, f"the file is truncated or corrupt ({type(err).__name__}: {err})") from err


def rng_safe_globals() -> list[Any]:
    """Return the NumPy globals ``torch.load(weights_only=True)`` must accept to read an RNG file.

    Returns:
        A list for ``torch.serialization.safe_globals``: NumPy's array rebuild function under its NumPy 1.x and
        2.x names, ``np.ndarray``, ``np.dtype`` and the ``uint32`` dtype class (MT19937 keys are uint32).
    """
    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    # The pickle names the function by the path of the NumPy that wrote it; accept both spellings.
    for path in ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"):
        allowed.append((reconstruct, path))
    return allowed


# ---- judging a folder before a resume --------------------------------------------------------------------------

_TORCH_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def _verify_torch_file(path: str, extra_safe_globals: Iterable[Any] | None = None) -> None:
    """Load a ``torch.save`` file the safe way without reading its tensors (memory-mapped), to judge it."""
    if not zipfile.is_zipfile(path):
        # Not a torch.save archive (a raw pickle, an old format, or cut short): judge it by a full safe load.
        safe_torch_load(path, extra_safe_globals=extra_safe_globals)
        return
    _weights_only_load(path, extra_safe_globals, map_location="cpu", mmap=True)


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
    has_training_files = any(name in training_files or name.startswith(RNG_STATE_PREFIX) for name in names)
    if TRAINER_STATE_NAME not in names and (
        checkpoint_step(os.path.basename(folder.rstrip(os.sep))) is not None or has_training_files
    ):
        raise CheckpointLoadError(
            state_path, "it is missing, so the save of this checkpoint did not finish (it is the last file written)"
        )
    checked = []
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(os.path.join(path, DCP_METADATA_NAME)):
            # HF's FSDP SHARDED_STATE_DICT folders (`pytorch_model_fsdp_0/`, `optimizer_0/`): their metadata pickle.
            verify_dcp_metadata(os.path.join(path, DCP_METADATA_NAME))
            checked.append(os.path.join(name, DCP_METADATA_NAME))
            continue
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
        elif name.startswith(RNG_STATE_PREFIX) and name.endswith(".pth"):
            _verify_torch_file(path, extra_safe_globals=rng_safe_globals())
        elif name.endswith(_TORCH_FILE_SUFFIXES):
            _verify_torch_file(path)
        else:
            continue
        checked.append(name)
    return checked



# ---- training arguments: never unpickled ----------------------------------------------------------------------


def mask_tokens(values: dict[str, Any]) -> dict[str, Any]:
    """Replace secrets such as ``hub_token`` by a placeholder, as HF does before writing arguments as JSON."""
    return {key: f"<{key.upper()}>" if key.endswith("_token") else value for key, value in values.items()}


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
    return mask_tokens({key: item for key, item in decoded.items() if not str(key).startswith("_")})


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


# ---- torch.distributed.checkpoint metadata ----------------------------------------------------------------------

# What a torch.distributed.checkpoint `.metadata` pickle names (torch 2.x): its own dataclasses, torch's sizes,
# dtypes and layouts, and the path type of the storage entries. Anything else is refused unread.
_DCP_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_DCP_METADATA_GLOBALS = frozenset({
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.Size",
    "torch.serialization._get_layout",
    "pathlib.PosixPath",
    "pathlib.PurePosixPath",
    "pathlib.WindowsPath",
    "pathlib.PureWindowsPath",
    "collections.OrderedDict",
})


def _allowed_dcp_global(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    if module in _DCP_METADATA_MODULES or name in _DCP_METADATA_GLOBALS:
        return True
    return module == "torch" and isinstance(getattr(torch, attribute, None), torch.dtype)


def verify_dcp_metadata(path: str | os.PathLike) -> None:
    """Judge a torch.distributed.checkpoint ``.metadata`` file before torch unpickles it (it runs what it names).

    The pickle is decoded without importing anything (as ``training_args.bin``); it may only name
    torch.distributed.checkpoint's metadata classes, torch sizes, dtypes and layouts, and paths.

    Raises:
        CheckpointLoadError: The file is unreadable, or names anything else (the message names it).
    """
    try:
        with open(path, "rb") as f:
            unpickler = _InertUnpickler(io.BytesIO(f.read()))
            unpickler.load()
    except Exception as err:  # noqa: BLE001 - every failure mode of a damaged file ends in the same advice
        raise CheckpointLoadError(path, f"it is truncated or corrupt ({type(err).__name__})") from None
    refused = sorted({name for name in unpickler.globals_seen if not _allowed_dcp_global(name)})
    if refused:
        raise CheckpointLoadError(
            path, f"it references {', '.join(refused)}, which a torch.distributed.checkpoint metadata file never "
            "holds, so loading it was refused"
        )
