"""Strict YAML -> dataclass building: the typed, validated reading every config section goes through.

A mistyped or unknown key stops at load time naming file and key, not deep inside a job. It knows no section:
those live with their packages and ``protoclip.project`` composes them.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import types
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from protoclip.errors import ConfigError


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


# PyYAML implements YAML 1.1, whose float pattern needs a dot and a signed exponent: ``1e9``, ``5e-4`` and
# ``2E5`` load as *strings*, although users (and YAML 1.2) read them as numbers. Numeric fields accept such
# strings when Python's float() parses them; '.nan' / '.inf' (and 'nan', 'inf') parse too and are then
# rejected as non-finite with the key named.
_NUMBER = re.compile(r"[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?")


def _number(value: Any) -> int | float | None:
    """``value`` as an int/float if a user wrote a number (YAML 1.1 or 1.2 spelling), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            number = float(text.replace("_", ""))
            return int(number) if number.is_integer() and not re.search(r"[.eE]", text) else number
        if text.lower().lstrip("+-") in (".nan", "nan", ".inf", "inf", "infinity"):
            return float(text.lower().replace(".", ""))
    return None


def _coerce(tp: Any, value: Any, key: str, where: str) -> Any:
    """Check ``value`` against annotation ``tp`` and build nested dataclasses."""
    origin = get_origin(tp)
    bad = ConfigError(f"{where}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} ({value!r})")
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key, where)
            except ConfigError:
                pass  # the next type of the union; none fits: `bad` names the union
        raise bad
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise bad
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return build(tp, value, where, prefix=f"{key}.")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = get_args(tp) or (Any,)
        if origin is tuple and Ellipsis not in args and len(value) != len(args):  # tuple[float, float]: 2 values
            raise ConfigError(f"{where}: '{key}' must have {len(args)} values, got {len(value)} ({value!r})")
        item_tp = args[0]
        items = [_coerce(item_tp, v, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {k: _coerce(val_tp, v, f"{key}.{k}", where) for k, v in value.items()}
    if tp is float:
        number = _number(value)
        if number is None:
            raise bad
        if not math.isfinite(number):
            raise ConfigError(f"{where}: '{key}' must be a finite number, got {value!r}")
        return float(number)
    if tp is int:
        number = _number(value)
        if number is None:
            raise bad
        if isinstance(number, float):
            if not math.isfinite(number):
                raise ConfigError(f"{where}: '{key}' must be a finite integer, got {value!r}")
            if not number.is_integer():
                raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
            number = int(number)
        return number
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if tp in (dict, list):  # bare container: type checked, contents checked where they are used
        if not isinstance(value, tp):
            raise bad
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise bad
        return Path(value)
    raise ConfigError(f"{where}: '{key}' has an unsupported annotation {_type_name(tp)}")


# field metadata key: a field the loader sets itself (the file a config came from), no YAML key of its own;
# the generated config schema and its key table leave it out (protoclip.dag.schema)
INTERNAL = "internal"
SECTIONS = "sections"  # field metadata key: the field holds sections other packages register (open_sections)
REGISTERED_BY = "registered_by"  # beside it: who registers them, in words (the generated config docs say it)


def open_sections(cls: type) -> tuple[str | None, dict[str, type]]:
    """(field name, {key: dataclass}) of ``cls``'s field of registered sections, or (None, {}).

    A dataclass may declare one field ``field(default_factory=dict, metadata={"sections": provider})``: its
    YAML keys are then the provider's keys (``train.nclip`` for ``TrainConfig``: the sections training
    methods register, protoclip.registry), each built strictly like a declared field, and
    :func:`to_dict` writes them beside the declared fields. The field's own name is not a YAML key."""
    for f in dataclasses.fields(cls):
        if SECTIONS in f.metadata:
            return f.name, f.metadata[SECTIONS]()
    return None, {}


class RegisteredSections:
    """Base of a config dataclass whose ``sections`` field holds registered sections (:func:`open_sections`):
    built in code (``TrainConfig()``), every registered section is there with its defaults; each reads as an
    attribute (``cfg.pcl.tau``). ``section_kind`` names them in the error for an unknown attribute."""

    section_kind: ClassVar[str] = "registered section"

    def __post_init__(self) -> None:
        _, registered = open_sections(type(self))
        self.sections = {key: self.sections.get(key) or section() for key, section in registered.items()}

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections") or {}  # (absent while unpickling: no recursion)
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or {self.section_kind} {name!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``get_type_hints(cls)``, once per class: it evaluates every string annotation afresh on each call, and a
    project config builds its few dataclasses hundreds of times (every run, target and claim)."""
    return get_type_hints(cls)


def build(cls: type, data: dict | None, where: str = "<config>", prefix: str = ""):
    """Build dataclass ``cls`` from ``data`` strictly: unknown keys and wrong types are errors.

    Errors name file and key (``'train.lr' must be float, got str``); ``1e9`` is accepted as a number,
    ``.nan`` / ``.inf`` are not. A key the dataclass lists in its ``MOVED`` ({old key: new dotted key}) stops
    naming where it went. The built object's ``validate()`` runs last.
    """
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: '{prefix.rstrip('.') or '<top>'}' must be a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    holder, sections = open_sections(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name != holder]
    unknown = sorted(set(data) - set(names) - set(sections))
    moved = [key for key in unknown if key in getattr(cls, "MOVED", {})]
    if moved:  # a key a section replaced (cls.MOVED: {old key: its new dotted key})
        raise ConfigError(f"{where}: '{prefix}{moved[0]}' is now '{prefix}{cls.MOVED[moved[0]]}'")
    if unknown:
        raise ConfigError(
            f"{where}: unknown key '{prefix}{unknown[0]}' (known keys of '{prefix.rstrip('.') or '<top>'}': "
            f"{', '.join(names + sorted(sections))})"
        )
    kwargs = {name: _coerce(hints[name], data[name], prefix + name, where) for name in names if name in data}
    if holder is not None:  # every registered section, from its YAML block or its defaults
        kwargs[holder] = {key: _coerce(section, data.get(key, {}), prefix + key, where)
                          for key, section in sections.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{where}: {prefix or ''}{err}") from None
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except ValueError as err:
            raise ConfigError(f"{where}: {prefix}{err}") from None
    return obj


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain YAML-able dict (Paths become strings)."""
    if dataclasses.is_dataclass(obj):
        holder, _ = open_sections(type(obj))
        out = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != holder}
        if holder is not None:  # registered sections sit beside the declared fields, as in the YAML
            out.update(to_dict(getattr(obj, holder)))
        return out
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def deep_merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; ``override`` wins. Inputs are not modified."""
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def require_path(path: str | Path, what: str) -> Path:
    """Return ``path`` if it exists, else stop with a message naming it."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what}: input path not found: {p}")
    return p


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping repeats a key (raised by :class:`StrictLoader`)."""


# libyaml's parser where PyYAML was built with it (the wheels are): the same documents, parsed ~10x faster than
# the pure-Python one, which every job pays in load_config (the config and its experiment and claims files)
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeLoader):
    """PyYAML's SafeLoader that refuses a key repeated in one mapping.

    YAML 1.2 requires mapping keys to be unique, but PyYAML keeps the last value without a word, so a second
    ``train:`` block silently replaces the first. Keys merged in with ``<<: *anchor`` may be overridden (that
    is what merge keys are for); only keys written twice in the same mapping are errors.
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeConstructor reports it
                    continue
                if first is not None:
                    raise DuplicateKeyError(
                        None, None, f"key '{key}' is repeated (first at line {first.line + 1}); PyYAML would "
                        "silently keep the last one", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict:
    """The mapping in YAML file ``path``; a missing file, a folder, non-UTF-8 bytes, invalid YAML or a repeated
    key stops with a :class:`ConfigError` naming the file (and the line)."""
    p = require_path(path, "config")
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, not a YAML file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r})") from None
    except OSError as err:
        raise ConfigError(f"{p}: cannot be read ({err.strerror or err})") from None
    try:
        data = yaml.load(text, Loader=StrictLoader) or {}
    except DuplicateKeyError as err:
        raise ConfigError(f"{p}: line {err.problem_mark.line + 1}: {err.problem}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = "; ".join(str(x) for x in (err.context, err.problem) if x)
        raise ConfigError(f"{p}: {where}not valid YAML: {' '.join(what.split())}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


__all__ = ["build", "open_sections", "RegisteredSections", "INTERNAL", "SECTIONS", "REGISTERED_BY", "to_dict", "deep_merge", "require_path", "read_yaml", "StrictLoader", "DuplicateKeyError"]
