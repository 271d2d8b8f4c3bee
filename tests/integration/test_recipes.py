"""docs/architecture.md's recipes, followed and counted on a copy of the package (the checkout is never edited).

"Adding a method: one file": the copy gains ``train/methods/mymethod.py``, written as the recipe says (a ``Method``
subclass with ``terms`` and ``total``, ``@register("mymethod", sections={"my": MyConfig})``), and nothing else; from
that copy a project config accepts ``train: {method: mymethod, my: {weight: 0.5}}`` (and refuses a bad
``my.weight``, naming it) and the trainer runs an episode of it, its loss term in the step records.

"Adding an evaluation task: one module": the copy gains the metric function's module and the task's module, and
nothing else; the config reads ``evaluate.mytask``, the report tables it, validation accepts it, the plan's
minimum-data rule and the adapter run it. The files each test touched are the ones its recipe names, counted
against its title."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from testkit import REPO

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}

MYMETHOD = '''"""``method: mymethod``: a toy InfoNCE of image against caption, weighted by ``train.my.weight``."""
from __future__ import annotations

from dataclasses import dataclass

from protoclip.train.methods.base import Method, register


@dataclass
class MyConfig:
    weight: float = 1.0  # the loss's weight

    def validate(self) -> None:
        if self.weight <= 0:
            raise ValueError("weight must be > 0")


@register("mymethod", sections={"my": MyConfig})
class MyMethod(Method):
    def outputs(self):
        return {"z_image", "z_text", "logit_scale"}

    def terms(self, model, out, positions, state):
        import torch

        logits = out["logit_scale"] * out["z_image"] @ out["z_text"].T
        return {"mine": torch.nn.functional.cross_entropy(logits, torch.arange(len(logits)))}

    def total(self, terms):
        return self.cfg.my.weight * terms["mine"]
'''

# run with the copy first on the path: load the project's config, then train one episode of the run
SCRIPT = '''
import sys
from pathlib import Path

import torch

import protoclip
from protoclip.errors import ConfigError
from protoclip.files.layout import Layout
from protoclip.files.records import read_train_log
from protoclip.project import load_config
from protoclip.train.loop import train
from testkit.training import RandomPairs, tiny_model

src, root = Path(sys.argv[1]), Path(sys.argv[2])
assert Path(protoclip.__file__).is_relative_to(src), protoclip.__file__  # the copy, not the checkout
torch.set_num_threads(1)
cfg = load_config(root / "config.yaml")
run = cfg.run("mine")
assert (run.method, run.my.weight) == ("mymethod", 0.5), (run.method, run.my)
try:
    load_config(root / "config.yaml", {"runs": {"bad": {"method": "mymethod", "my": {"weight": -1}}}})
except ConfigError as err:
    print("refused:", err)
files = Layout.from_config(cfg).train_files("mine")
train(tiny_model(run), RandomPairs(n=16), run, files, stop_after_episodes=1)
steps = read_train_log(files.log, "step")
print("steps:", len(steps), "terms:", sorted(k for k in steps[0] if "mine" in k))
'''


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def follow(tmp_path: Path, new_files: dict[str, str]) -> tuple[Path, list[str]]:
    """A copy of src/protoclip under ``tmp_path/src`` with ``new_files`` (path under src -> text) written into it;
    the copy's root and the files that differ from the copy as it was (added, changed or removed)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "protoclip", src / "protoclip", ignore=shutil.ignore_patterns("__pycache__"))
    before = digests(src)
    for rel, text in new_files.items():
        (src / rel).write_text(text)
    after = digests(src)
    return src, sorted(k for k in after if before.get(k) != after[k]) + sorted(set(before) - set(after))


def recipe(title_start: str) -> tuple[str, str]:
    """docs/architecture.md's recipe whose title starts with ``title_start``: its title's rest and its text."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    title = next(line for line in doc.splitlines() if line.startswith(title_start))
    return title[len(title_start):], doc.split(title, 1)[1].split("\n#", 1)[0]


def named_files(text: str) -> list[str]:
    """The files under src/ that a recipe's text names, in order."""
    return re.findall(r"`src/(protoclip/[\w/]+\.py)`", text)


def run(script: str, src: Path, *args: str, cwd: Path) -> str:
    """``script`` in a fresh interpreter that imports protoclip from the copy ``src`` (and testkit); its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO / "tests")])}
    out = subprocess.run([sys.executable, "-c", script, str(src), *args], capture_output=True, text=True, env=env,
                         cwd=cwd, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_method_is_one_new_module(tmp_path):
    from testkit.training import STAGE_RUN, tiny_project

    src, touched = follow(tmp_path, {"protoclip/train/methods/mymethod.py": MYMETHOD})
    count, text = recipe("### Adding a method: ")
    assert touched == named_files(text) == ["protoclip/train/methods/mymethod.py"]
    assert NUMBERS[count.split()[0]] == len(touched) and count.startswith("one file")
    assert "train: {method: mymethod, my: {weight: 0.5}}" in text

    project = tmp_path / "project"
    tiny_project(project, {"train": {**STAGE_RUN, "episode_size": 16, "batch_size": 8},
                       "runs": {"mine": {"method": "mymethod", "my": {"weight": 0.5}}}}, n=8)
    out = run(SCRIPT, src, str(project), cwd=tmp_path)
    assert "refused:" in out and "my.weight must be > 0" in out, out
    steps, terms = re.search(r"steps: (\d+) terms: (.*)", out).groups()
    assert int(steps) == 2 and "mine" in terms, out


MYMETRIC = '''"""A toy metric: the share of test labels under a bound (arrays in, a JSON-able dict out)."""
from __future__ import annotations

import numpy as np


def below_rate(labels, below: int) -> tuple[dict, np.ndarray]:
    hits = (np.asarray(labels) < below).astype(np.float64)
    return {"top1": 100.0 * float(hits.mean())}, hits
'''

MYTASK = '''"""The toy task: a hit per test image whose label is under ``evaluate.mytask.below``."""
from __future__ import annotations

from dataclasses import dataclass

from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes, with_labels
from protoclip.tasks import Task, register


@dataclass
class MyTaskConfig:
    below: int = 5  # the label bound

    def validate(self) -> None:
        if self.below < 1:
            raise ValueError(f"below must be >= 1, got {self.below}")


def task_mytask(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.mytask import below_rate

    m, hits = below_rate(x.feats.test_y, x.cfg.mytask.below)
    return TaskResult(m, "labels", sizes(x.feats), with_labels({"top1": hits}, x.feats))


def too_small(feats, similarity):
    return "mytask needs 3 test images" if len(feats.test_y) < 3 else None


TASK = register(Task("mytask", ("top1",), task_mytask, examples="hits", validation=True, settings=MyTaskConfig,
                     too_small=too_small))
'''

TASK_SCRIPT = '''
import sys
from pathlib import Path

import numpy as np
import yaml

import protoclip
from protoclip.errors import ConfigError
from protoclip.evaluate.adapters import adapter_of
from protoclip.evaluate.plan import too_small
from protoclip.evaluate.set_features import SetFeatures
from protoclip.evaluate.tasks.base import SetInput
from protoclip.project import load_config
from protoclip.report.tables import table_tasks
from protoclip.similarity import Similarity
from protoclip.train.config import ValidationConfig

src, root = Path(sys.argv[1]), Path(sys.argv[2])
assert Path(protoclip.__file__).is_relative_to(src), protoclip.__file__  # the copy, not the checkout
path = root / "c.yaml"
path.write_text(yaml.safe_dump({"evaluate": {"mytask": {"below": 3}}}))
cfg = load_config(path)
assert cfg.evaluate.mytask.below == 3
path.write_text(yaml.safe_dump({"evaluate": {"mytask": {"below": 0}}}))
try:
    load_config(path)
except ConfigError as err:
    print("refused:", err)
assert "mytask" in table_tasks()
ValidationConfig(every_episodes=1, dataset="x", tasks=["mytask"]).validate()
feats = SetFeatures(test_z=np.zeros((4, 2)), test_y=np.array([0, 1, 2, 3]))
print("too small:", too_small("mytask", SetFeatures(test_z=np.zeros((2, 2)), test_y=np.array([0, 1])), Similarity()))
print("runs:", too_small("mytask", feats, Similarity()))
print("top1:", adapter_of("mytask")(SetInput(feats, None, cfg.evaluate, None)).metrics["top1"])
'''


def test_a_task_is_one_module_and_its_metric(tmp_path):
    src, touched = follow(tmp_path, {"protoclip/evaluate/metrics/mytask.py": MYMETRIC,
                                     "protoclip/evaluate/tasks/mytask.py": MYTASK})
    count, text = recipe("### Adding an evaluation task: ")
    assert named_files(text) == ["protoclip/evaluate/metrics/mytask.py", "protoclip/evaluate/tasks/mytask.py"]
    assert touched == sorted(named_files(text))
    task_modules = [f for f in touched if f.startswith("protoclip/evaluate/tasks/")]
    assert NUMBERS[count.split()[0]] == len(task_modules) and count.startswith("one module")  # and its metric
    out = run(TASK_SCRIPT, src, str(tmp_path), cwd=tmp_path)
    assert "refused:" in out and "evaluate.mytask.below must be >= 1" in out, out
    assert "too small: " in out and "mytask needs 3 test images" in out and "runs: None" in out, out
    assert "top1: 75.0" in out, out  # labels 0, 1, 2 of 0..3 under evaluate.mytask.below = 3
