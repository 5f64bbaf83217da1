"""Typed, validated loading of YAML into frozen dataclass specs.

Every loader error is a `SpecError` whose text is one line:
``<file>: <field.path>: <what is wrong> (<what is allowed>)``.
The CLI prints that line and exits with status 2.

A spec is a frozen dataclass. Field types drive the checks (int, float, str,
bool, Literal[...], X | None, tuple[X, ...], dict[str, X], nested specs).
Range checks live in field metadata: ``field(default=1.0, metadata={"gt": 0})``
(keys ``gt``, ``ge``, ``le``, ``lt``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

ROOT = Path(__file__).resolve().parent.parent


class SpecError(Exception):
    """A bad input, reported as one line naming file, field path and what is allowed."""

    def __init__(self, file: str | Path | None, path: str, message: str):
        self.file = str(file) if file is not None else "<input>"
        self.path = path
        self.message = message
        where = f"{self.file}: {path}: " if path else f"{self.file}: "
        super().__init__(where + message)


def load_yaml(file: str | Path) -> dict:
    """Read a YAML mapping; a missing or malformed file is a SpecError."""
    p = Path(file)
    if not p.is_file():
        raise SpecError(p, "", "file not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(p, "", f"{where}malformed YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(p, "", f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, file: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, file, path)
            except SpecError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise SpecError(file, path, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise SpecError(
                file, path, f"unknown {value!r} (allowed: {', '.join(str(a) for a in allowed)})"
            )
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise SpecError(file, path, f"expected {_type_name(tp)}, got {value!r}")
        (item,) = get_args(tp)[:1]
        return tuple(_convert(item, v, file, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(file, path, f"expected {_type_name(tp)}, got {value!r}")
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, file, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file=file, path=path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(file, path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise SpecError(file, path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(file, path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(file, path, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"specload: unsupported field type {tp!r}")


def _check_range(meta: typing.Mapping, value: Any, file: Any, path: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    for key, ok, word in (
        ("gt", lambda v, b: v > b, ">"),
        ("ge", lambda v, b: v >= b, ">="),
        ("lt", lambda v, b: v < b, "<"),
        ("le", lambda v, b: v <= b, "<="),
    ):
        if key in meta and not ok(value, meta[key]):
            raise SpecError(file, path, f"{value!r} is out of range (allowed: {word} {meta[key]})")


def build(cls: type, data: Any, *, file: Any = None, path: str = "") -> Any:
    """Build frozen dataclass `cls` from a mapping, checking keys, types and ranges."""
    if not isinstance(data, dict):
        raise SpecError(file, path or "(top)", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise SpecError(
            file,
            _join(path, str(key)),
            f"unknown key (allowed: {', '.join(sorted(fields))})",
        )
    kwargs = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(file, sub, f"missing required field ({_type_name(hints[name])})")
            continue
        value = _convert(hints[name], data[name], file, sub)
        _check_range(f.metadata, value, file, sub)
        kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        problem = check()
        if problem:
            field_name, message = problem
            raise SpecError(file, _join(path, field_name), message)
    return obj


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def known_names(folder: Path, suffix: str = ".yaml") -> list[str]:
    """Names of the spec files (or sub-folders when suffix is '') in a data folder."""
    if not folder.is_dir():
        return []
    if suffix:
        return sorted(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}"))
    return sorted(p.name for p in folder.iterdir() if p.is_dir())
