"""Typed, validated loading of YAML into frozen dataclass specs.

Every loader error is a `SpecError` whose text is one line:
``<file>: <field.path>: <what is wrong> (<what is allowed>)``.
The CLI prints that line and exits with status 2.

A spec is a frozen dataclass. Field types drive the checks (int, float, str,
bool, Literal[...], X | None, tuple[X, ...], dict[str, X], nested specs).
Range checks live in field metadata: ``field(default=1.0, metadata={"gt": 0})``
(keys ``gt``, ``ge``, ``le``, ``lt``). Every number must be finite, and every
integer must fit in 64 bits, unless a field's metadata says ``"finite": False``.

Input files must be UTF-8 text without NUL bytes; a YAML mapping may not repeat a
key; anchors and aliases may not expand a document past `MAX_YAML_NODES` nodes or
`MAX_YAML_DEPTH` levels (a "billion laughs" file is refused before it is built).
Values shown in errors are cut to about 80 characters.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the checkout: sim/io/specload.py

# ---- bounds that are not physical limits, stated once (README: "Limits") ----------
MAX_REQUESTS = 10**8  # requests in one run (num_requests, duration_s x rate, trace rows)
MAX_TOKENS = 10**7  # any one length: prompt, output, cap, trace cell, prefix
MAX_TIME_S = 10**9  # any time in seconds: duration, arrival, trace time, wait (~32 years)
MAX_SEED = 2**63 - 1  # seeds are 0 .. 2**63 - 1
MAX_BLOCK_SIZE = 1024  # tokens per KV block (vLLM allows up to 256 on CUDA)
MAX_LOGNORMAL_SIGMA = 10.0  # std of log(length); samples are also clipped at MAX_TOKENS
MAX_PREFIX_BLOCKS = 10**7  # synthetic prefix hashes (shared_prefix, multi_turn), ~0.4 GB
MAX_HOST_GIB = 10**6  # host memory for swap or a prefix-cache tier (1 PiB)
MIN_GAMMA_CV, MAX_GAMMA_CV = 1e-3, 1e3  # burstiness of gamma arrivals (1 = Poisson)
MAX_INT = 2**63 - 1  # any integer field (so that it fits numpy's int64)
MAX_SPEC_BYTES = 10 * 2**20  # a scenario, model or profile YAML file
MAX_YAML_NODES = 100_000  # YAML nodes after expanding aliases
MAX_YAML_DEPTH = 64  # nesting levels of a YAML document
_SHOW_CHARS = 80  # values shown in error messages are cut to this


class SpecError(Exception):
    """A bad input, reported as one line naming file, field path and what is allowed."""

    def __init__(self, file: str | Path | None, path: str, message: str):
        self.file = _one_line(str(file) if file is not None else "<input>", 200)
        self.path = _one_line(path, 200)
        self.message = _one_line(message, 1000)
        where = f"{self.file}: {self.path}: " if self.path else f"{self.file}: "
        super().__init__(where + self.message)

    def __reduce__(self):
        """Pickled by its parts (a worker process or Ray task raises it to the parent),
        whatever arguments a subclass's constructor takes."""
        return _rebuild_spec_error, (type(self), self.file, self.path, self.message), self.__dict__


def _rebuild_spec_error(cls: type, file: str, path: str, message: str) -> SpecError:
    err = cls.__new__(cls)
    SpecError.__init__(err, file, path, message)
    return err


def _one_line(text: str, limit: int) -> str:
    """`text` with line breaks escaped, cut to `limit` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = _SHOW_CHARS
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 6


def show(value: Any) -> str:
    """A short repr of `value` for an error message (bounded time, ~80 characters); YAML's
    own words for true, false and null, as the user wrote them."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = _REPR.repr(value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def is_file(p: str | Path) -> bool:
    """Path.is_file that says False, not OSError, for a name too long or otherwise unusable."""
    try:
        return Path(p).is_file()
    except (OSError, ValueError):
        return False


def is_dir(p: str | Path) -> bool:
    """Path.is_dir that says False, not OSError, for a name too long or otherwise unusable."""
    try:
        return Path(p).is_dir()
    except (OSError, ValueError):
        return False


def read_text(file: str | Path, *, max_bytes: int | None = None) -> str:
    """A file's text: UTF-8 (a BOM is allowed), no NUL bytes; otherwise a SpecError."""
    p = Path(file)
    try:
        if max_bytes is not None and p.stat().st_size > max_bytes:
            raise SpecError(p, "", f"file is {p.stat().st_size:,} bytes (allowed: at most {max_bytes:,})")
        raw = p.read_bytes()
    except OSError as e:
        raise SpecError(p, "", f"cannot read: {e.strerror or e} (allowed: a readable file)") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SpecError(p, "line 1", "UTF-16 text (allowed: UTF-8 text)")
    nul = raw.find(b"\0")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise SpecError(p, f"line {line}", "contains a NUL byte (allowed: UTF-8 text)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(p, f"line {line}", f"byte {raw[e.start]:#04x} is not UTF-8 (allowed: UTF-8 text)") from None


def load_yaml(file: str | Path, what: str = "YAML file") -> dict:
    """Read a YAML mapping; a missing or malformed file is a SpecError (`what` names the
    kind of file a folder given in its place is not)."""
    p = Path(file)
    if not is_file(p):
        if is_dir(p):
            raise SpecError(p, "", f"is a folder, not a {what} (allowed: a YAML file)")
        raise SpecError(p, "", "file not found")
    data = parse_yaml(read_text(p, max_bytes=MAX_SPEC_BYTES), p)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(p, "", f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_cli_value(text: str, where: str) -> Any:
    """A command-line value (`--set FIELD=VALUE`, `--values`) read as YAML; `where` names
    the argument in errors, e.g. ``--set workload.arrival.rate``."""
    file, _, path = where.partition(" ")
    return parse_yaml(text, file, path, what="value")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading YAML 1.2 numbers such as 1e3 and 2.5E-4 as floats
    (YAML 1.1 wants a dot and a signed exponent: 1.0e+3)."""


_YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789"))
_FastLoader: type | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _FastLoader(yaml.CSafeLoader):  # type: ignore[no-redef]
        """`_Loader` on libyaml's parser (the same nodes, ~10x faster); the constructor and
        the resolver, with the YAML 1.2 floats, are PyYAML's own."""

    _FastLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT,
                                      list("-+0123456789"))
_C_MAX_LEVELS = 1000  # libyaml's composer recurses in C, unguarded: only shallower texts


def _fast_loader(text: str):
    """libyaml's loader for a text that cannot nest past _C_MAX_LEVELS (each level needs a
    `[`, `{`, `-` or `?`, or a deeper indent); None: PyYAML's alone (it stops at Python's
    recursion limit)."""
    if _FastLoader is None:
        return None
    opens = text.count("[") + text.count("{") + text.count("-") + text.count("?")
    if opens > _C_MAX_LEVELS or opens + max(
            (len(line) - len(line.lstrip(" ")) for line in text.splitlines()),
            default=0) > _C_MAX_LEVELS:
        return None
    return _FastLoader(text)


def parse_yaml(text: str, file: Any, path: str = "", *, what: str = "YAML") -> Any:
    """Parse one YAML document with the checks above (duplicate keys, alias expansion,
    depth); errors name `file` (and `path`, for a command-line value). A text libyaml
    refuses is parsed again by PyYAML, so that errors read the same either way."""
    fast = _fast_loader(text)
    if fast is not None:
        try:
            return _parse(fast, file, path, what)
        except Exception:  # noqa: BLE001, S110  (PyYAML's own answer and error, below)
            pass
        finally:
            fast.dispose()
    loader = _Loader(text)
    try:
        return _parse(loader, file, path, what)
    finally:
        loader.dispose()


def _parse(loader, file: Any, path: str, what: str) -> Any:
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise SpecError(file, path, f"nested too deeply (allowed: at most {MAX_YAML_DEPTH} levels)") from None
        if node is None:
            return None
        _check_nodes(node, file, path)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None and not path else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(file, path, f"{where}malformed {what}: {problem} (allowed: YAML)") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a date 2001-13-45, a 5000-digit int
        raise SpecError(file, path, f"malformed {what}: {show(str(e))} (allowed: YAML)") from None


def _check_nodes(root: yaml.Node, file: Any, base: str) -> None:
    """Refuse repeated mapping keys, cycles, and documents whose aliases expand past
    MAX_YAML_NODES nodes or MAX_YAML_DEPTH levels, before anything is constructed."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)
    busy: set[int] = set()

    def visit(node: yaml.Node, path: str, depth: int) -> tuple[int, int]:
        if depth > MAX_YAML_DEPTH:
            raise SpecError(file, path, f"nested too deeply (allowed: at most {MAX_YAML_DEPTH} levels)")
        key = id(node)
        if key in busy:
            raise SpecError(file, path, "an alias refers to a node that contains it (allowed: no cycles)")
        if key not in sizes:
            busy.add(key)
            size, height = 1, 0
            if isinstance(node, yaml.MappingNode):
                seen: dict[tuple[str, str], int] = {}
                for k, v in node.value:
                    scalar = isinstance(k, yaml.ScalarNode)
                    sub = _join(path, show(k.value)[1:-1] if scalar else "?")
                    if scalar and k.tag != "tag:yaml.org,2002:merge":
                        if (k.tag, k.value) in seen:
                            first = seen[k.tag, k.value]
                            raise SpecError(file, sub, f"duplicate key on line {k.start_mark.line + 1} (first on line {first}; allowed: each key once)")
                        seen[k.tag, k.value] = k.start_mark.line + 1
                    for child in (k, v):
                        s, h = visit(child, sub, depth + 1)
                        size, height = size + s, max(height, h + 1)
            elif isinstance(node, yaml.SequenceNode):
                for i, v in enumerate(node.value):
                    s, h = visit(v, f"{path}[{i}]", depth + 1)
                    size, height = size + s, max(height, h + 1)
            busy.discard(key)
            sizes[key] = (size, height)
        size, height = sizes[key]
        if depth + height > MAX_YAML_DEPTH:
            raise SpecError(file, path, f"nested too deeply (allowed: at most {MAX_YAML_DEPTH} levels)")
        if size > MAX_YAML_NODES:
            raise SpecError(file, path or "(top)", f"aliases expand to over {MAX_YAML_NODES:,} values (allowed: at most {MAX_YAML_NODES:,})")
        return size, height

    visit(root, base, 0)


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


def _allowed(tp: Any, meta: typing.Mapping) -> str:
    """What a scalar field takes, with its range: `an integer > 0`, `a finite number >= 0`."""
    what = _type_name(tp)
    if tp is float and meta.get("finite", True):
        what = "a finite number"
    bounds = [f"{word} {meta[key]:,}" if isinstance(meta[key], int) and abs(meta[key]) >= 10**5
              else f"{word} {meta[key]}"
              for key, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if key in meta]
    return f"(allowed: {what}{' ' + ' and '.join(bounds) if bounds else ''})"


def _convert(tp: Any, value: Any, file: Any, path: str, meta: typing.Mapping = types.MappingProxyType({})) -> Any:
    """`value` as type `tp`; `meta` is the field's metadata ("finite": False lets a float be inf)."""
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
                return _convert(a, value, file, path, meta)
            except SpecError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise SpecError(file, path, f"expected {_type_name(tp)}, got {show(value)} (allowed: {_type_name(tp)})")
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool | int | float | str) and value in allowed:
            return value
        raise SpecError(file, path, f"unknown {show(value)} (allowed: {', '.join(str(a) for a in allowed)})")
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise SpecError(file, path, f"expected {_type_name(tp)}, got {show(value)} (allowed: a YAML list, [a, b, ...])")
        (item,) = get_args(tp)[:1]
        return tuple(_convert(item, v, file, f"{path}[{i}]", meta) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(file, path, f"expected {_type_name(tp)}, got {show(value)} (allowed: a YAML mapping, {{key: value, ...}})")
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, file, f"{path}.{k}", meta) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file=file, path=path)
    return _scalar(tp, value, file, path, meta)


def _scalar(tp: Any, value: Any, file: Any, path: str, meta: typing.Mapping) -> Any:
    """`value` as bool, int (64-bit unless the field bounds it), finite float, or str."""
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(file, path, f"expected true or false, got {show(value)} (allowed: true, false)")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(file, path, f"expected an integer, got {show(value)} {_allowed(tp, meta)}")
        if abs(value) > MAX_INT and "le" not in meta and "lt" not in meta:
            raise SpecError(file, path, f"{show(value)} is too large (allowed: at most {MAX_INT:,} in size)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(file, path, f"expected a number, got {show(value)} {_allowed(tp, meta)}")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = math.copysign(math.inf, value)
        if not math.isfinite(number) and meta.get("finite", True):
            raise SpecError(file, path, f"{show(value)} is not finite (allowed: a finite number)")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(file, path, f"expected a string, got {show(value)} (allowed: text)")
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
            bound = f"{meta[key]:,}" if isinstance(meta[key], int) and abs(meta[key]) >= 10**5 else f"{meta[key]}"
            raise SpecError(file, path, f"{show(value)} is out of range (allowed: {word} {bound})")


def build(cls: type, data: Any, *, file: Any = None, path: str = "") -> Any:
    """Build frozen dataclass `cls` from a mapping, checking keys, types and ranges."""
    if not isinstance(data, dict):
        raise SpecError(file, path or "(top)", f"expected a mapping, got {show(data)} "
                        "(allowed: a YAML mapping, {key: value, ...})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise SpecError(
            file,
            _join(path, show(key)[1:-1] if isinstance(key, str) and key else show(key)),
            f"unknown key (allowed: {', '.join(sorted(fields))})",
        )
    kwargs = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(file, sub, f"missing required field ({_type_name(hints[name])})")
            continue
        value = _convert(hints[name], data[name], file, sub, f.metadata)
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
