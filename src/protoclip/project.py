"""The project config: the YAML file every stage reads, composed from the sections of the packages that use them.

Each section is owned by its package; this module only composes them into :class:`ProjectConfig`, which
``load_config("config/config.yaml")`` reads strictly (:mod:`protoclip.config.strict`) with the experiment files it
lists, checking every run and target up front. Only the CLI, ``protoclip.dag`` and the stage entry points import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from protoclip.claims.config import ClaimConfig, ClaimsConfig
from protoclip.data.config import PrepareConfig
from protoclip.errors import ConfigError
from protoclip.evaluate.config import EvaluateConfig
from protoclip.jobs.gpu_slots import GpuSlotsConfig
from protoclip.files.layout import PathsConfig
from protoclip.report.paper_targets import TargetConfig
from protoclip.config.strict import INTERNAL, build, deep_merge, read_yaml, to_dict
from protoclip.tasks import TASKS as EVAL_TASKS
from protoclip.teacher.config import TeacherConfig
from protoclip.toy.config import ToyConfig
from protoclip.train.config import HELDOUT_SET as HELDOUT, SAME_QUANTITY, TrainConfig


@dataclass
class ProjectConfig:
    paths: PathsConfig = field(default_factory=PathsConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    train: TrainConfig = field(default_factory=TrainConfig)  # defaults every run starts from
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    toy: ToyConfig = field(default_factory=ToyConfig)  # PAUC's NEMD toy experiment (protoclip toy-nemd)
    gpus: GpuSlotsConfig = field(default_factory=GpuSlotsConfig)  # which GPU ids jobs run on (protoclip.jobs.gpu_slots)
    claims: ClaimsConfig = field(default_factory=ClaimsConfig)  # the claims ledger (protoclip.report.ledger_table)
    experiments: list[str] = field(default_factory=list)  # experiment files (relative to this config)
    # files whose `target:` block only is read (their runs are not): a config with its own runs of the same
    # names (config/paper.yaml) reuses the offline default's target declarations this way
    targets: list[str] = field(default_factory=list)
    runs: dict[str, dict] = field(default_factory=dict)  # extra runs defined inline: name -> overrides
    # applied on top of EVERY run's overrides (config/ci.yaml: the same runs, tiny epochs); {} = none
    train_force: dict = field(default_factory=dict)
    source: str = field(default="<config>", metadata={INTERNAL: True})  # set by load_config: the file read

    # resolved {run name -> (overrides, file it came from)}, filled by load_config
    _runs: dict = field(default_factory=dict, repr=False)
    # {base name -> [run names]} of runs declared with `seeds:` (expanded to <base>_s<seed>)
    _groups: dict = field(default_factory=dict, repr=False)
    # {target id -> (protoclip.report.paper_targets.TargetConfig, file it came from)}
    _targets: dict = field(default_factory=dict, repr=False)
    # the claims of `claims.files`, in order: [(protoclip.claims.config.ClaimConfig, file it came from)]
    _claims: list = field(default_factory=list, repr=False)

    def paper_targets(self) -> list[TargetConfig]:
        """The declared paper targets (tables, figures) in declaration order, resolved: each row names the run
        it uses in this config (``TargetConfig.resolved``)."""
        return [t.resolved(self) for t, _ in self._targets.values()]

    def paper_claims(self) -> list[ClaimConfig]:
        """The claims of the ledger (``claims.files``) in declaration order."""
        return [c for c, _ in self._claims]

    def run_names(self) -> list[str]:
        return list(self._runs)

    def run_base(self, name: str) -> str:
        """The name run ``name`` is declared under in its file (``clip_s1`` -> ``clip``: its overrides key)."""
        return next((base for base, names in self._groups.items() if name in names), name)

    def run_targets(self, run: str) -> list[str]:
        """The ids of the paper targets (tables, figures) that show run ``run``: its experiment files' ``target:``
        rows (a seeds group stands for each of its runs) or reference run (the MLflow runs' target tags). Derived
        from the config, so neither the CLI nor a Snakemake rule / DVC stage has to pass them."""
        return sorted(t.id for t in self.paper_targets() if any(run in self.run_group(base) for base in t.runs()))

    def run_group(self, name: str) -> list[str]:
        """The runs a target's row ``name`` stands for: its seeds' runs, or [name]; [] when not configured."""
        if name in self._groups:
            return list(self._groups[name])
        return [name] if name in self._runs else []

    def runs_without_data(self) -> dict[str, str]:
        """{run: reason} of the runs none of whose training data exists (every ``prepare.user_data`` set it
        trains on has no file: a user with CC3M but not YFCC). They get no job; the report shows them as
        skipped with the reason, and the runs whose data is there run as usual."""
        from protoclip.data.corpus.userdata import absent_reason  # heavy: pandas, only when asked which runs lack data

        absent = {u.name: why for u in self.prepare.user_data if (why := absent_reason(u))}
        out = {}
        for name in self._runs:
            run = self.run(name)
            data = [] if run.pretrained.enabled else run.data  # a released checkpoint trains on nothing here
            if data and all(d in absent for d in data):
                out[name] = "training data absent (" + "; ".join(absent[d] for d in data) + ")"
        return out

    def run(self, name: str) -> TrainConfig:
        """The complete training config of run ``name`` (train defaults + its overrides): ``cfg.run("clip_tiny_s0")``.

        A run (``runs:`` in the experiment files) is overrides merged onto ``train:``; the nearer level wins
        (``train_force`` > the run's keys > ``train:`` > defaults), also for a quantity two keys can set
        (``SAME_QUANTITY``): a level that sets one clears the others below it (:func:`layer`), a level setting two
        stops (:func:`check_same_quantity`)."""
        if name not in self._runs:
            raise ConfigError(f"{self.source}: unknown run '{name}' (defined: {', '.join(self._runs) or 'none'})")
        overrides, where = self._runs[name]
        merged = layer(layer(to_dict(self.train), overrides), self.train_force)
        merged["name"] = name
        return build(TrainConfig, merged, f"{where} (run '{name}')", prefix="")


def set_keys(level: dict, group: tuple[str, ...]) -> list[str]:
    """The keys of ``group`` that ``level`` sets (to a value other than null)."""
    return [k for k in group if level.get(k) is not None]


def check_same_quantity(level: dict, where: str) -> None:
    """Stop when one config level sets one quantity through two keys (``SAME_QUANTITY``): which should win is
    not the loader's guess."""
    for group in SAME_QUANTITY:
        if len(both := set_keys(level, group)) > 1:
            raise ConfigError(f"{where}: {' and '.join(both)} both set the same quantity at one level; set one")


def layer(lower: dict, level: dict) -> dict:
    """``level`` merged over ``lower``; where ``level`` sets a quantity of ``SAME_QUANTITY``, the keys of its
    group that ``level`` does not set fall back to the dataclass defaults (a run's ``warmup_episodes`` is not
    overridden by a file-level ``warmup_samples``)."""
    lower = dict(lower)
    for group in SAME_QUANTITY:
        if set_keys(level, group):
            for k in group:
                if k not in level:
                    lower[k] = TRAIN_FIELD_DEFAULTS[k]
    return deep_merge(lower, level)


TRAIN_FIELD_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}

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


def _read_claims(path: Path, cfg: ProjectConfig) -> list[tuple[ClaimConfig, str]]:
    """The claims of ``cfg.claims.files`` (each a YAML file with a top-level ``claims:`` list), validated; a
    claim naming a declared target must name its rows and columns (a typo stops here, not in the report)."""
    out: list[tuple[ClaimConfig, str]] = []
    seen: dict[str, str] = {}
    for name in cfg.claims.files:
        file = (path.parent / name) if not Path(name).is_absolute() else Path(name)
        data = read_yaml(file)
        unknown = sorted(set(data) - {"claims"})
        if unknown or not isinstance(data.get("claims"), list):
            raise ConfigError(f"{file}: a claims file holds one key, `claims:`, a list"
                              + (f" (unknown key '{unknown[0]}')" if unknown else ""))
        for i, entry in enumerate(data["claims"]):
            # this config's comparison: the claim's own target's, or paper_config's where that is not declared
            claim = build(ClaimConfig, entry, str(file), prefix=f"claims[{i}].").resolved(cfg._targets)
            if claim.id in seen:
                raise ConfigError(f"{file}: claim '{claim.id}' is already declared in {seen[claim.id]}")
            seen[claim.id] = str(file)
            if claim.target in cfg._targets:
                target = cfg._targets[claim.target][0]
                rows, cols = {r.label for r in target.rows}, {c.label for c in target.columns}
                bad = [r for r in (claim.a, claim.b) if r is not None and r not in rows]
                bad += [c for c in claim.columns if c not in cols]
                if bad:
                    raise ConfigError(f"{file}: claim '{claim.id}': target '{claim.target}' has no row or column "
                                      f"'{bad[0]}' (rows: {', '.join(sorted(rows))}; columns: "
                                      f"{', '.join(c.label for c in target.columns)})")
            out.append((claim, str(file)))
    return out


def _check_columns_have_sets(target: TargetConfig, where: str, datasets: dict, path: Path) -> None:
    """Each evaluation column of a target with runs here names at least one set that evaluate.datasets defines (its
    paper set or a stand-in): else no evaluation is planned for it and the table's column stays empty, unexplained."""
    for col in target.columns:
        sets = col.datasets + col.offline
        if col.task in EVAL_TASKS and not any(d in datasets for d in sets):
            raise ConfigError(f"{where}: target '{target.id}': column '{col.label}' names set(s) {sets}, none of "
                              f"which is under evaluate.datasets of {path} (defined: "
                              f"{', '.join(sorted(datasets)) or 'none'})")


def load_config(path: str | Path = "config/config.yaml", overrides: dict | None = None) -> ProjectConfig:
    """Read, merge experiment files and validate everything (every run and target too) up front.

    A run declared in several experiment files (shared by several targets) is trained once: its
    definitions must be identical, else it is an error naming both files.
    """
    path = Path(path)
    data = deep_merge(read_yaml(path), overrides or {})
    cfg = build(ProjectConfig, data, str(path))
    cfg.source = str(path)
    check_same_quantity(data.get("train") or {}, f"{path}: train")
    check_same_quantity(cfg.train_force, f"{path}: train_force")
    runs, groups, declared, targets = _read_experiments(cfg, path)
    _add_config_runs(cfg, path, runs, groups, declared)
    cfg._runs, cfg._groups = runs, groups
    _check_targets(cfg, path, targets)
    cfg._targets = {tid: (t, where) for tid, (t, where, _) in targets.items()}
    cfg._claims = _read_claims(path, cfg)
    _check_runs(cfg, path, runs)
    return cfg


def _read_experiments(cfg: ProjectConfig, path: Path) -> tuple[dict, dict, dict, dict]:
    """The runs (seed-expanded: name -> (overrides, file)), seed groups, runs as declared (before seed expansion,
    for the identity check) and targets (id -> (target, file, whether its file's runs count)) of the experiment and
    target files that ``cfg`` lists, in their order."""
    runs: dict[str, tuple[dict, str]] = {}
    groups: dict[str, list[str]] = {}
    declared: dict[str, tuple[dict, str]] = {}
    targets: dict[str, tuple[Any, str, bool]] = {}
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
            check_same_quantity(ov, f"{exp_path}: run '{name}'")
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
    return runs, groups, declared, targets


def _add_config_runs(cfg: ProjectConfig, path: Path, runs: dict, groups: dict, declared: dict) -> None:
    """Add the runs the config file itself declares (``runs:``) to ``runs`` / ``groups``; a name the experiment
    files already define is an error."""
    for name, ov in cfg.runs.items():
        if name in runs or name in groups:
            raise ConfigError(f"{path}: run '{name}' is already defined in {runs.get(name, declared.get(name))[1]}")
        if isinstance(ov, dict):
            check_same_quantity(ov, f"{path}: run '{name}'")
        expanded = expand_seeds(name, ov, str(path)) if isinstance(ov, dict) else {name: ov}
        if isinstance(ov, dict) and SEEDS_KEY in ov:
            groups[name] = list(expanded)
        for run_name, run_ov in expanded.items():
            runs[run_name] = (run_ov, str(path))


def _check_targets(cfg: ProjectConfig, path: Path, targets: dict) -> None:
    """A target of a listed experiment must have runs here, and its columns' sets must be configured."""
    for tid, (t, where, with_runs) in targets.items():
        wanted = [r.run for r in t.rows if r.run]
        if with_runs and wanted and not t.resolved(cfg).runs_configured(cfg):
            raise ConfigError(f"{where}: target '{tid}': none of its rows' runs ({wanted}) is defined")
        if with_runs:
            _check_columns_have_sets(t, where, cfg.evaluate.datasets, path)


def _check_runs(cfg: ProjectConfig, path: Path, runs: dict) -> None:
    """Validate every run now, not when it starts training: its data sources and its validation set."""
    # the prepared sources a run can train on: 'offline' only while prepare.offline_sources lists some (with none,
    # the default train.data [offline] would read no pairs: a pyarrow error deep in training, before this check)
    sources = {u.name for u in cfg.prepare.user_data} | ({"offline"} if cfg.prepare.offline_sources else set())
    for name in runs:
        tcfg = cfg.run(name)
        unknown = [] if tcfg.pretrained.enabled else [d for d in tcfg.data if d not in sources]
        if not tcfg.data and not tcfg.pretrained.enabled:
            raise ConfigError(f"{runs[name][1]}: run '{name}': train.data is empty (sources prepared by {path}: "
                              f"{', '.join(sorted(sources)) or 'none'})")
        if unknown and unknown[0] == "offline":
            raise ConfigError(f"{runs[name][1]}: run '{name}': train.data has 'offline' (the default) but "
                              f"prepare.offline_sources is empty in {path}: set train.data to prepared sources "
                              f"({', '.join(sorted(sources)) or 'none: add prepare.user_data'})")
        if unknown:
            raise ConfigError(f"{runs[name][1]}: run '{name}' trains on '{unknown[0]}', which is neither 'offline' "
                              f"nor a prepare.user_data name of {path} ({', '.join(sorted(sources)) or 'none'})")
        val = tcfg.validation
        if val.every_episodes and val.dataset != HELDOUT and val.dataset not in cfg.evaluate.datasets:
            raise ConfigError(f"{runs[name][1]}: run '{name}': validation.dataset '{val.dataset}' is not a set of "
                              f"evaluate.datasets in {path} (configured: "
                              f"{', '.join(sorted(cfg.evaluate.datasets)) or 'none'}; {HELDOUT} needs no entry)")


__all__ = ["ProjectConfig", "PathsConfig", "load_config", "expand_seeds"]
