"""Fill argument dataclasses from the command line, a dict, JSON or YAML, as transformers' `HfArgumentParser` does.

Each init field of each dataclass becomes one argparse option whose type, choices, default and
arity follow from the field's type annotation. The rules (including HF's quirks, such as which
member of a `Union` wins) are those of transformers 5.23, so a training script that switches its
import to hf_lightning parses every command line, JSON, YAML file and dict to the same values.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class ModelArguments:
    ...     model_name_or_path: str
    ...     use_fast_tokenizer: bool = True
    >>> parser = HfArgumentParser(ModelArguments)
    >>> (model_args,) = parser.parse_args_into_dataclasses(
    ...     ["--model-name-or-path", "gpt2", "--no_use_fast_tokenizer"], look_for_args_file=False
    ... )
    >>> model_args
    ModelArguments(model_name_or_path='gpt2', use_fast_tokenizer=False)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = ["HfArg", "HfArgumentParser", "string_to_bool"]

_NoneType = type(None)
_TRUE_WORDS = frozenset({"yes", "true", "t", "y", "1"})
_FALSE_WORDS = frozenset({"no", "false", "f", "n", "0"})


def string_to_bool(value: str | bool) -> bool:
    """Read a command-line word as a boolean.

    Args:
        value: One of yes/no, true/false, t/f, y/n, 1/0 in any letter case, or a bool (returned as is).

    Returns:
        The boolean the word stands for.

    Raises:
        argparse.ArgumentTypeError: If the word is none of the accepted spellings.
    """
    if isinstance(value, bool):
        return value
    word = value.lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(
        f"invalid boolean value {value!r}: use one of yes/no, true/false, t/f, y/n, 1/0 (any letter case)"
    )


def HfArg(  # noqa: N802 - the name HF scripts import
    *,
    aliases: str | list[str] | None = None,
    help: str | None = None,  # noqa: A002 - mirrors argparse's keyword
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    metadata: dict | None = None,
    **kwargs: Any,
) -> dataclasses.Field:
    """Declare a dataclass field with its command-line aliases and help in one call.

    Args:
        aliases: Extra option strings for the field, e.g. `["--lr", "-l"]`.
        help: The help text shown by `--help`.
        default: The field's default; with neither this nor `default_factory` the option is required.
        default_factory: A zero-argument callable making the default (use it for lists).
        metadata: Further metadata for `dataclasses.field`; `aliases` and `help` are added to a copy.
        **kwargs: Passed on to `dataclasses.field` (e.g. `init`, `repr`).

    Returns:
        The `dataclasses.Field`.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Args:
        ...     learning_rate: float = HfArg(default=1e-3, aliases=["--lr"], help="Peak learning rate.")
        >>> HfArgumentParser(Args).parse_args_into_dataclasses(["--lr", "0.1"], look_for_args_file=False)
        (Args(learning_rate=0.1),)
    """
    field_metadata = dict(metadata or {})
    if aliases is not None:
        field_metadata["aliases"] = aliases
    if help is not None:
        field_metadata["help"] = help
    return dataclasses.field(metadata=field_metadata, default=default, default_factory=default_factory, **kwargs)


class _ChoiceConverter:
    """Maps the text of a choice back to the choice itself (an enum value, a `Literal` member).

    Text that names no choice is passed through so that argparse reports it as an invalid choice.
    """

    def __init__(self, choices: Iterable[Any]) -> None:
        self._by_text = {str(choice): choice for choice in choices}
        # argparse names the type in "invalid <type> value" messages.
        self.__name__ = "choice"

    def __call__(self, text: str) -> Any:
        return self._by_text.get(text, text)


class _UnsupportedType:
    """Stands in for a type the parser cannot convert to, failing with a clear message only when used.

    HF builds the parser for such fields and fails only once a value is given; this keeps that
    behaviour but says what is wrong.
    """

    def __init__(self, field_name: str, annotation: Any) -> None:
        self._field_name = field_name
        self._annotation = annotation
        self.__name__ = "unsupported"

    def __call__(self, text: str) -> Any:
        raise argparse.ArgumentTypeError(
            f"field '{self._field_name}' is annotated {self._annotation}, which the parser cannot convert a "
            "command-line value to (one type per argument); set it in code, a JSON/YAML file or parse_dict instead"
        )


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) is typing.Union or isinstance(annotation, types.UnionType)


def _narrow_union(annotation: Any, field_name: str) -> Any:
    """Pick the one type a `Union` field is parsed as, by HF's rules.

    `X | None` gives `X`; a union with `str` gives its other member (HF looks at the first two
    members only); `bool | None` is kept whole because the bool rules treat it specially.
    """
    members = typing.get_args(annotation)
    optional = _NoneType in members
    if str not in members and (len(members) != 2 or not optional):
        raise ValueError(
            f"Field '{field_name}' is annotated {annotation}: a Union is only supported as Optional[X] "
            "(X | None) or together with str, because each command-line argument has one type. "
            "Annotate the field with a single type."
        )
    if not optional:
        return members[0] if members[1] is str else members[1]
    if bool in members:
        return annotation
    return members[0] if members[1] is _NoneType else members[1]


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or annotation == (bool | None)


@dataclasses.dataclass(frozen=True)
class _ArgumentSpec:
    """The positional option strings and keyword arguments of one `add_argument` call."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any]


def _argument_specs(field: dataclasses.Field, annotation: Any) -> list[_ArgumentSpec]:
    """Translate one dataclass field (with its resolved annotation) into argparse arguments.

    Returns the field's own argument and, for bool fields defaulting to True, the `--no_<name>`
    switch after it (argparse must see the positive one first: both share a destination).
    """
    name = field.name
    flags = [f"--{name}"]
    if "_" in name:
        flags.append(f"--{name.replace('_', '-')}")
    kwargs = dict(field.metadata)
    aliases = kwargs.pop("aliases", [])
    flags.extend([aliases] if isinstance(aliases, str) else aliases)

    if _is_union(annotation):
        annotation = _narrow_union(annotation, name)
    origin = typing.get_origin(annotation) or annotation
    has_default = field.default is not dataclasses.MISSING
    has_factory = field.default_factory is not dataclasses.MISSING
    negation_kwargs: dict[str, Any] | None = None

    if origin is typing.Literal or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        choices = typing.get_args(annotation) if origin is typing.Literal else [m.value for m in annotation]
        kwargs["choices"] = choices
        # Values come back as the enum's *value* (not the member): the dataclass converts, as in HF.
        kwargs["type"] = _ChoiceConverter(choices)
        # HF ignores default_factory here: such a field is required on the command line.
        if has_default:
            kwargs["default"] = field.default
        else:
            kwargs["required"] = True
    elif _is_bool(annotation):
        if field.default is True:
            negation_kwargs = {**kwargs, "default": False}
        kwargs["type"] = string_to_bool
        if annotation is bool or (has_default and field.default is not None):
            # Without a value the flag means True; an explicit word may follow. `Optional[bool] = None`
            # skips this so that the user must say which (leaving it out keeps None).
            kwargs["default"] = field.default if has_default else False
            kwargs["nargs"] = "?"
            kwargs["const"] = True
    elif isinstance(origin, type) and issubclass(origin, list):
        item_types = typing.get_args(annotation)
        if len(item_types) != 1:
            raise TypeError(
                f"Field '{name}' is annotated {annotation}: a list field needs its item type, e.g. list[str], "
                "so that each command-line value can be converted."
            )
        kwargs["type"] = item_types[0]
        kwargs["nargs"] = "+"
        if has_factory:
            kwargs["default"] = field.default_factory()
        elif not has_default:
            kwargs["required"] = True
    else:
        kwargs["type"] = _UnsupportedType(name, annotation) if _is_union(annotation) else annotation
        if has_default:
            kwargs["default"] = field.default
        elif has_factory:
            kwargs["default"] = field.default_factory()
        else:
            kwargs["required"] = True

    specs = [_ArgumentSpec(tuple(flags), kwargs)]
    if negation_kwargs is not None:
        negation_flags = (f"--no_{name}", f"--no-{name.replace('_', '-')}")
        specs.append(_ArgumentSpec(negation_flags, {**negation_kwargs, "action": "store_false", "dest": name}))
    return specs


def _resolved_annotations(dataclass_type: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(dataclass_type)
    except NameError as err:
        raise RuntimeError(
            f"Could not resolve the type annotations of {dataclass_type.__name__} ({err}). Define the dataclass and "
            "every type it names at module level, or remove `from __future__ import annotations` from its module."
        ) from err


def _init_field_names(dataclass_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(dataclass_type) if f.init]


class HfArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` that builds its options from dataclasses and fills instances of them.

    Every init field becomes `--field_name` (and `--field-name` when the name has an underscore, plus
    the field's `metadata["aliases"]`); the rest of the field's metadata (`help`, `choices`, ...) is
    passed to `add_argument`. The field's type decides the rest:

    * `Enum` and `Literal` fields accept the enum values / literal members (`choices`);
    * `list[T]` fields take one or more values converted with `T`;
    * `Optional[X]` / `X | None` parse as `X`; a union with `str` parses as its other member;
    * `bool` fields accept `--flag` alone (True) or `--flag <yes|no|true|false|t|f|y|n|1|0>`; those
      defaulting to True also get `--no_flag` / `--no-flag`; `Optional[bool] = None` needs a value;
    * fields without a default are required; `init=False` fields are skipped.

    More options may be added with `add_argument`; their values come back in an extra namespace.
    A dataclass with an `_argument_group_name` attribute gets its own argument group in `--help`.

    Args:
        dataclass_types: One dataclass type or an iterable of them, in the order the parse methods
            return their instances.
        **kwargs: Passed to `argparse.ArgumentParser`; `formatter_class` defaults to
            `argparse.ArgumentDefaultsHelpFormatter` so that `--help` shows the defaults.

    Raises:
        TypeError: If an entry is not a dataclass type, or a list field has no item type.
        ValueError: If a field's `Union` annotation has no single type to parse as.
        RuntimeError: If a dataclass's string annotations cannot be resolved.
    """

    dataclass_types: list[type]

    def __init__(self, dataclass_types: type | Iterable[type] | None = None, **kwargs: Any) -> None:
        if dataclass_types is None:
            dataclass_types = []
        elif dataclasses.is_dataclass(dataclass_types) or not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        self.dataclass_types = list(dataclass_types)
        for dataclass_type in self.dataclass_types:
            self._add_dataclass_arguments(dataclass_type)

    def _add_dataclass_arguments(self, dataclass_type: type) -> None:
        if not (isinstance(dataclass_type, type) and dataclasses.is_dataclass(dataclass_type)):
            raise TypeError(
                f"HfArgumentParser takes dataclass types, got {dataclass_type!r}; pass the class itself "
                "(decorated with @dataclass), not an instance."
            )
        group_name = getattr(dataclass_type, "_argument_group_name", None)
        target = self.add_argument_group(group_name) if group_name is not None else self
        annotations = _resolved_annotations(dataclass_type)
        for field in dataclasses.fields(dataclass_type):
            if not field.init:
                continue
            for spec in _argument_specs(field, annotations[field.name]):
                target.add_argument(*spec.flags, **spec.kwargs)

    def parse_args_into_dataclasses(
        self,
        args: list[str] | None = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: str | os.PathLike | None = None,
        args_file_flag: str | None = None,
    ) -> tuple[Any, ...]:
        """Parse command-line words into one instance of each dataclass.

        Words read from args files come first, so the command line overrides them (argparse keeps
        the last value given for an option).

        Args:
            args: The words to parse; `sys.argv[1:]` when None.
            return_remaining_strings: Return the words no option consumed instead of raising on them.
            look_for_args_file: Read `<script>.args` beside the running script (`sys.argv[0]`) when it
                exists; ignored when `args_filename` is given.
            args_filename: An args file to read instead of `<script>.args`.
            args_file_flag: An option (e.g. `"--args_file"`) naming further args files on the command
                line; it may repeat, and later files override earlier ones.

        Returns:
            The dataclass instances in the order of `dataclass_types`; then an `argparse.Namespace`
            with the values of options added with `add_argument`, if there are any; then the list of
            unconsumed words when `return_remaining_strings` is set.

        Raises:
            ValueError: If some words were not consumed and `return_remaining_strings` is False.
            SystemExit: As argparse does, for `--help` (code 0) and invalid values (code 2).
        """
        if args_file_flag or args_filename or (look_for_args_file and sys.argv):
            args = self._args_from_files(args, look_for_args_file, args_filename, args_file_flag)
        namespace, remaining = self.parse_known_args(args=args)
        values = vars(namespace)
        outputs: list[Any] = []
        for dataclass_type in self.dataclass_types:
            names = _init_field_names(dataclass_type)
            outputs.append(dataclass_type(**{name: values.pop(name) for name in names if name in values}))
        if values:
            outputs.append(namespace)
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining}")
        return tuple(outputs)

    @staticmethod
    def _args_from_files(
        args: list[str] | None,
        look_for_args_file: bool,
        args_filename: str | os.PathLike | None,
        args_file_flag: str | None,
    ) -> list[str]:
        """Prepend the whitespace-separated words of the args files that exist to the command line."""
        paths: list[Path] = []
        if args_filename:
            paths.append(Path(args_filename))
        elif look_for_args_file and sys.argv:
            paths.append(Path(sys.argv[0]).with_suffix(".args"))
        if args_file_flag:
            # A throwaway parser takes the flag's occurrences out of the words; add_help=False leaves
            # `--help` for the real parser.
            flag_parser = argparse.ArgumentParser(add_help=False)
            action = flag_parser.add_argument(args_file_flag, type=str, action="append")
            found, args = flag_parser.parse_known_args(args=args)
            paths.extend(Path(p) for p in getattr(found, action.dest) or [])
        words: list[str] = []
        for path in paths:
            if path.exists():
                words += path.read_text().split()
        return words + (list(args) if args is not None else sys.argv[1:])

    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Fill the dataclasses from a dict, without argparse (values are used as they are, unconverted).

        Args:
            args: Field names to values; each key goes to every dataclass that has a field of that name.
            allow_extra_keys: Ignore keys that name no field instead of raising.

        Returns:
            The dataclass instances in the order of `dataclass_types`.

        Raises:
            TypeError: If `args` is not a mapping.
            ValueError: If some keys name no field and `allow_extra_keys` is False.
        """
        if not isinstance(args, dict):
            raise TypeError(
                f"HfArgumentParser.parse_dict expects a dict of field names to values, got {type(args).__name__}"
            )
        unused = set(args)
        outputs = []
        for dataclass_type in self.dataclass_types:
            names = set(_init_field_names(dataclass_type))
            inputs = {key: value for key, value in args.items() if key in names}
            unused -= inputs.keys()
            outputs.append(dataclass_type(**inputs))
        if unused and not allow_extra_keys:
            raise ValueError(f"Some keys are not used by the HfArgumentParser: {sorted(unused)}")
        return tuple(outputs)

    def parse_json_file(self, json_file: str | os.PathLike, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Fill the dataclasses from a JSON file holding one object; see `parse_dict`.

        Args:
            json_file: Path of the UTF-8 JSON file.
            allow_extra_keys: Ignore keys that name no field instead of raising.

        Returns:
            The dataclass instances in the order of `dataclass_types`.
        """
        data = json.loads(Path(json_file).read_text(encoding="utf-8"))
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)

    def parse_yaml_file(self, yaml_file: str | os.PathLike, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Fill the dataclasses from a YAML file holding one mapping (read with `yaml.safe_load`); see `parse_dict`.

        Args:
            yaml_file: Path of the UTF-8 YAML file.
            allow_extra_keys: Ignore keys that name no field instead of raising.

        Returns:
            The dataclass instances in the order of `dataclass_types`.

        Raises:
            ImportError: If PyYAML is not installed.
        """
        try:
            import yaml
        except ImportError as err:
            raise ImportError(
                "HfArgumentParser.parse_yaml_file needs PyYAML, which is not installed: run `pip install pyyaml`, "
                "or convert the file to JSON and use parse_json_file."
            ) from err
        data = yaml.safe_load(Path(yaml_file).read_text(encoding="utf-8"))
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)
