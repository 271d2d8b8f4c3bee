"""The linear probe on z^I, not normalised (paper Sec. IV-C2, Table VII): the run's linear protocol, ProtoCLIP's
(L-BFGS, :func:`protoclip.evaluate.metrics.linear.linear_probe`; SGD above ``sgd_above`` samples) or another
paper's SGD recipe (:mod:`protoclip.evaluate.protocols`,
:func:`protoclip.evaluate.metrics.linear_sgd.sgd_protocol_probe`).
Settings: ``evaluate.linear``."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from protoclip.evaluate.protocols import PROTOCLIP, PROTOCOLS, ProtocolName, check_protocol
from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes, with_labels
from protoclip.jobs.devices import resolve_device
from protoclip.tasks import Task, register


@dataclass
class LinearConfig:
    """``evaluate.linear``: the linear probe."""
    max_iter: int = 1000  # L-BFGS iterations (CLIP protocol, paper Sec. IV-C2)
    center: bool = True  # L-BFGS on features minus their train mean: same optimum, converges (linear.py)
    # resolution of the L-BFGS probe's C search (metrics/linear.py search_C): 4 = one halving fewer than CLIP's 8
    steps_per_decade: int = 4
    sgd_above: int = 100_000  # more training samples -> SGD probe (paper: SGD for ImageNet, L-BFGS else)
    # the linear probe's protocol (evaluate.protocols): protoclip = ProtoCLIP's (Sec. IV-C2: the L-BFGS / SGD probe
    # above, the keys above); pcl, nclip, mocov3 = PCL's, nCLIP's, the temperature paper's SGD recipes
    protocol: ProtocolName = PROTOCLIP
    # {run name pattern (fnmatch, e.g. "pcl_*"): protocol} for runs scored under another protocol than
    # protocol (config/paper.yaml: each paper's runs under its own); a run two patterns match is an error
    protocol_runs: dict[str, ProtocolName] = field(default_factory=dict)

    def validate(self) -> None:
        if self.max_iter < 1 or self.steps_per_decade < 1 or self.sgd_above < 0:
            raise ValueError(f"max_iter and steps_per_decade must be >= 1 and sgd_above >= 0, got {self.max_iter}, "
                             f"{self.steps_per_decade}, {self.sgd_above}")
        check_protocol(self.protocol, "evaluate.linear.protocol")
        for pattern, name in self.protocol_runs.items():
            check_protocol(name, f"evaluate.linear.protocol_runs[{pattern!r}]")

    def protocol_of(self, run: str) -> str:
        """The linear protocol run ``run`` is scored under: the one pattern of protocol_runs matching its name,
        else protocol."""
        matched = sorted(p for p in self.protocol_runs if fnmatchcase(run, p))
        if len(matched) > 1:
            raise ValueError(f"run '{run}' matches several evaluate.linear.protocol_runs patterns: "
                             f"{', '.join(matched)}")
        return self.protocol_runs[matched[0]] if matched else self.protocol

    def check_runs(self, runs: list[str]) -> list[str]:
        """Stop on a run that two patterns of protocol_runs match; return a warning naming the patterns that
        match none of ``runs`` (a typo, or an overlay that leaves out the experiment files of those runs)."""
        for run in runs:
            self.protocol_of(run)
        unmatched = [p for p in self.protocol_runs if not any(fnmatchcase(r, p) for r in runs)]
        return [f"evaluate.linear.protocol_runs: {', '.join(unmatched)} match no run"] if unmatched else []


def task_linear(x: SetInput) -> TaskResult:
    """The run's linear protocol on z^I: ProtoCLIP's (L-BFGS, SGD above sgd_above samples) or a paper's own SGD
    recipe (evaluate.protocols); ``protocol`` in the metrics names it."""
    from protoclip.evaluate.metrics.linear import linear_probe, sgd_linear_probe  # heavy: torch, config loads tasks

    f, cfg, s = x.feats, x.cfg, x.cfg.linear
    protocol = s.protocol_of(x.run)
    args = (f.train_z, f.train_y, f.test_z, f.test_y)
    if protocol != PROTOCLIP:
        from protoclip.evaluate.metrics.linear_sgd import sgd_protocol_probe  # heavy: torch, config loads tasks

        m, hits = sgd_protocol_probe(*args, PROTOCOLS[protocol], seed=cfg.seed, num_classes=len(x.ds.classnames),
                                     device=resolve_device(cfg.device), per_example=True)
        m["solver"] = "sgd"
    elif len(f.train_y) > s.sgd_above:  # paper: SGD for ImageNet, L-BFGS for the small sets
        m, hits = sgd_linear_probe(*args, seed=cfg.seed, num_classes=len(x.ds.classnames), per_example=True)
        m["solver"] = "sgd"
    else:
        m, hits = linear_probe(*args, seed=cfg.seed, max_iter=s.max_iter, center=s.center,
                               steps_per_decade=s.steps_per_decade, per_example=True)
        m.update(solver="lbfgs", centred=s.center)
    m["protocol"] = protocol
    return TaskResult(m, "z_image (not normalised)", sizes(f, train=True), with_labels(hits, f))


def params(s: LinearConfig, run: str) -> dict:
    """The MLflow params of a run's evaluation: the protocol it is scored under."""
    return {"linear_protocol": s.protocol_of(run)}


TASK = register(Task("linear", ("top1",), task_linear, probe=True, examples="hits", order=20,  # Table VII
                     settings=LinearConfig, params=params))

__all__ = ["TASK", "LinearConfig", "task_linear"]
