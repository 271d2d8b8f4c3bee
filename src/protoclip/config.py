"""Typed, validated configuration: YAML -> dataclasses, checked up front.

Every stage reads one YAML file (default ``config/config.yaml``) into :class:`ProjectConfig`.
Each section is a dataclass owned by the package that uses it (``protoclip.data.config``,
``protoclip.teacher.config``, ...); this module only composes them and validates strictly:

* an unknown key stops with ``<file>: unknown key 'train.lrr' (known: ...)``;
* a wrong type stops with ``<file>: 'train.lr' must be float, got str ('abc')``; numbers written as
  ``1e9`` (a string to PyYAML) are accepted, non-finite numbers (``.nan``, ``.inf``) are errors;
* a configured input path that does not exist stops with a message naming the path
  (see :func:`require_path`);
* a YAML file with a repeated key (two ``train:`` blocks, a run declared twice) stops naming the key, the
  file and both lines (PyYAML keeps the last one silently; :class:`StrictLoader`); a folder or a file that
  is not UTF-8 stops naming the file;
* every value is checked when the config loads, not seconds later inside the job: each section's
  ``validate()`` (ranges, model architecture, device names), so a bad value is one line naming key and file.

Runs (``runs:`` in the experiment files listed under ``experiments:``) are overrides merged
onto the ``train:`` defaults, so every run's resolved config is a complete ``TrainConfig``.

    from protoclip.config import load_config
    cfg = load_config("config/config.yaml")
    cfg.run("protoclip_tiny")   # -> TrainConfig with the run's overrides applied
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from protoclip.errors import UserError


class ConfigError(UserError):
    """A configuration problem; the message names the file and the key."""

    kind = "config error"


# --------------------------------------------------------------------------- strict builder
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


def build(cls: type, data: dict | None, where: str = "<config>", prefix: str = ""):
    """Build dataclass ``cls`` from ``data`` strictly: unknown keys and wrong types are errors."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: '{prefix.rstrip('.') or '<top>'}' must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key '{prefix}{unknown[0]}' (known keys of '{prefix.rstrip('.') or '<top>'}': "
            f"{', '.join(names)})"
        )
    kwargs = {name: _coerce(hints[name], data[name], prefix + name, where) for name in names if name in data}
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
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
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


class StrictLoader(yaml.SafeLoader):
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


# --------------------------------------------------------------------------- project config
from protoclip.data.config import PrepareConfig  # noqa: E402  (sections live with their packages)
from protoclip.evaluate.config import EvaluateConfig  # noqa: E402
from protoclip.teacher.config import TeacherConfig  # noqa: E402
from protoclip.toy.config import ToyConfig  # noqa: E402
from protoclip.train.config import TrainConfig  # noqa: E402


@dataclass
class PathsConfig:
    data_dir: Path = Path("data")  # raw Debian packages, prepared data, teacher cache
    results_dir: Path = Path("results")  # runs, metrics, tables, figures
    # MLflow tracking store; a local SQLite file by default (open with `mlflow ui --backend-store-uri <this>`)
    mlflow_uri: str = "sqlite:///results/mlflow.db"
    mlflow_experiment: str = "protoclip-repro"


@dataclass
class ProjectConfig:
    paths: PathsConfig = field(default_factory=PathsConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    train: TrainConfig = field(default_factory=TrainConfig)  # defaults every run starts from
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    toy: ToyConfig = field(default_factory=ToyConfig)  # PAUC's NEMD toy experiment (protoclip toy-nemd)
    experiments: list[str] = field(default_factory=list)  # experiment files (relative to this config)
    # files whose `target:` block only is read (their runs are not): a config with its own runs of the same
    # names (config/paper.yaml) reuses the offline default's target declarations this way
    targets: list[str] = field(default_factory=list)
    runs: dict[str, dict] = field(default_factory=dict)  # extra runs defined inline: name -> overrides
    # applied on top of EVERY run's overrides (config/ci.yaml: the same runs, tiny epochs); {} = none
    train_force: dict = field(default_factory=dict)
    source: str = "<config>"  # set by load_config; the file this came from

    # resolved {run name -> (overrides, file it came from)}, filled by load_config
    _runs: dict = field(default_factory=dict, repr=False)
    # {base name -> [run names]} of runs declared with `seeds:` (expanded to <base>_s<seed>)
    _groups: dict = field(default_factory=dict, repr=False)
    # {target id -> (protoclip.report.targets.TargetConfig, file it came from)}
    _targets: dict = field(default_factory=dict, repr=False)

    def run_names(self) -> list[str]:
        return list(self._runs)

    def run_base(self, name: str) -> str:
        """The name run ``name`` is declared under in its file (``clip_s1`` -> ``clip``: its overrides key)."""
        return next((base for base, names in self._groups.items() if name in names), name)

    def run_group(self, name: str) -> list[str]:
        """The runs a target's row ``name`` stands for: its seeds' runs, or [name]; [] when not configured."""
        if name in self._groups:
            return list(self._groups[name])
        return [name] if name in self._runs else []

    def run(self, name: str) -> TrainConfig:
        """The complete training config of run ``name`` (train defaults + its overrides)."""
        if name not in self._runs:
            raise ConfigError(f"{self.source}: unknown run '{name}' (defined: {', '.join(self._runs) or 'none'})")
        overrides, where = self._runs[name]
        merged = deep_merge(deep_merge(to_dict(self.train), overrides), self.train_force)
        merged["name"] = name
        return build(TrainConfig, merged, f"{where} (run '{name}')", prefix="")


SEEDS_KEY = "seeds"  # a run's `seeds: [0, 1, 2]` -> runs <name>_s0, <name>_s1, <name>_s2 (train.seed set)


def expand_seeds(name: str, overrides: dict, where: str) -> dict[str, dict]:
    """{run name: overrides} of one declared run; ``seeds`` expands it into one run per seed."""
    if SEEDS_KEY not in overrides:
        return {name: overrides}
    seeds = overrides[SEEDS_KEY]
    if (not isinstance(seeds, list) or not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds)
            or len(set(seeds)) != len(seeds)):
        raise ConfigError(f"{where}: run '{name}': 'seeds' must be a non-empty list of distinct ints, got {seeds!r}")
    if "seed" in overrides:
        raise ConfigError(f"{where}: run '{name}': give either 'seed' or 'seeds', not both")
    base = {k: v for k, v in overrides.items() if k != SEEDS_KEY}
    return {f"{name}_s{x}": {**base, "seed": x} for x in seeds}


def _read_experiment(exp_path: Path, with_runs: bool) -> tuple[dict, Any]:
    """(runs {name: overrides}, target dict or None) of one experiment file, keys checked."""
    exp_data = read_yaml(exp_path)
    known = ("description", "runs", "target")
    unknown = sorted(set(exp_data) - set(known))
    if unknown:
        raise ConfigError(f"{exp_path}: unknown key '{unknown[0]}' (known keys: {', '.join(known)})")
    runs = exp_data.get("runs") or {}
    if not isinstance(runs, dict):
        raise ConfigError(f"{exp_path}: 'runs' must be a mapping of run name -> overrides")
    return (runs if with_runs else {}), exp_data.get("target")


def load_config(path: str | Path = "config/config.yaml", overrides: dict | None = None) -> ProjectConfig:
    """Read, merge experiment files and validate everything (every run and target too) up front.

    A run declared in several experiment files (shared by several targets) is trained once: its
    definitions must be identical, else it is an error naming both files.
    """
    from protoclip.report.targets import TargetConfig

    path = Path(path)
    data = deep_merge(read_yaml(path), overrides or {})
    cfg = build(ProjectConfig, data, str(path))
    cfg.source = str(path)
    runs: dict[str, tuple[dict, str]] = {}
    groups: dict[str, list[str]] = {}
    declared: dict[str, tuple[dict, str]] = {}  # as written (before seed expansion), for the identity check
    targets: dict[str, tuple[Any, str]] = {}
    target_files = [(f, True) for f in cfg.experiments] + [(f, False) for f in cfg.targets if f not in cfg.experiments]
    for exp, with_runs in target_files:
        exp_path = (path.parent / exp) if not Path(exp).is_absolute() else Path(exp)
        exp_runs, target = _read_experiment(exp_path, with_runs)
        for name, ov in exp_runs.items():
            if not isinstance(ov, dict):
                raise ConfigError(f"{exp_path}: run '{name}' must be a mapping of overrides")
            if name in declared:
                if declared[name][0] != ov:
                    raise ConfigError(f"{exp_path}: run '{name}' is already defined differently in "
                                      f"{declared[name][1]} (a shared run must have one definition)")
                continue  # shared by several targets: trained and evaluated once
            declared[name] = (ov, str(exp_path))
            expanded = expand_seeds(name, ov, str(exp_path))
            if SEEDS_KEY in ov:
                groups[name] = list(expanded)
            for run_name, run_ov in expanded.items():
                if run_name in runs:
                    raise ConfigError(f"{exp_path}: run '{run_name}' is already defined in {runs[run_name][1]}")
                runs[run_name] = (run_ov, str(exp_path))
        if target is not None:
            t = build(TargetConfig, target, str(exp_path), prefix="target.")
            if t.id in targets:
                raise ConfigError(f"{exp_path}: target '{t.id}' is already declared in {targets[t.id][1]}")
            targets[t.id] = (t, str(exp_path), with_runs)
    for name, ov in cfg.runs.items():
        if name in runs or name in groups:
            raise ConfigError(f"{path}: run '{name}' is already defined in {runs.get(name, declared.get(name))[1]}")
        expanded = expand_seeds(name, ov, str(path)) if isinstance(ov, dict) else {name: ov}
        if isinstance(ov, dict) and SEEDS_KEY in ov:
            groups[name] = list(expanded)
        for run_name, run_ov in expanded.items():
            runs[run_name] = (run_ov, str(path))
    cfg._runs, cfg._groups = runs, groups
    for tid, (t, where, with_runs) in targets.items():  # a target of a listed experiment must have runs here
        wanted = [r.run for r in t.rows if r.run]
        if with_runs and wanted and not t.resolved(cfg).runs_configured(cfg):
            raise ConfigError(f"{where}: target '{tid}': none of its rows' runs ({wanted}) is defined")
    cfg._targets = {tid: (t, where) for tid, (t, where, _) in targets.items()}
    sources = {"offline"} | {u.name for u in cfg.prepare.user_data}
    for name in runs:  # validate every run now, not when it starts training
        unknown = [d for d in cfg.run(name).data if d not in sources]
        if unknown:
            raise ConfigError(f"{runs[name][1]}: run '{name}' trains on '{unknown[0]}', which is neither 'offline' "
                              f"nor a prepare.user_data name of {path} ({', '.join(sorted(sources))})")
    return cfg


__all__ = [
    "ConfigError", "ProjectConfig", "PathsConfig", "build", "to_dict", "deep_merge", "load_config",
    "require_path", "read_yaml", "expand_seeds", "StrictLoader", "UserError",
]
