"""docs/architecture.md's recipe "Adding a method: one file", followed and counted: a copy of the package gains one
module, ``train/methods/mymethod.py``, written as the recipe says (a ``Method`` subclass with ``terms`` and
``total``, ``@register("mymethod", sections={"my": MyConfig})``); nothing else of the copy changes, and from that copy
a project config accepts ``train: {method: mymethod, my: {weight: 0.5}}`` (and refuses a bad ``my.weight``, naming
it) and the trainer runs an episode of it, its loss term in the step records. The files the test touched are
counted against the recipe's title."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from testkit import REPO

RECIPE = "### Adding a method: "
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}

MYMETHOD = '''"""``method: mymethod``: a toy InfoNCE of the image against its caption, weighted by ``train.my.weight``."""
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


def test_a_method_is_one_new_module(tmp_path):
    from testkit.training import STAGE_RUN, tiny_project

    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "protoclip", src / "protoclip", ignore=shutil.ignore_patterns("__pycache__"))
    before = digests(src)
    (src / "protoclip" / "train" / "methods" / "mymethod.py").write_text(MYMETHOD)
    after = digests(src)
    touched = sorted(k for k in after if before.get(k) != after[k]) + sorted(set(before) - set(after))
    assert touched == ["protoclip/train/methods/mymethod.py"]

    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    title = next(line for line in doc.splitlines() if line.startswith(RECIPE))
    assert NUMBERS[title[len(RECIPE):].split()[0]] == len(touched)
    recipe = doc.split(title, 1)[1].split("\n#", 1)[0]
    assert re.findall(r"`src/(protoclip/[\w/]+\.py)`", recipe) == touched  # the file the recipe names
    assert "train: {method: mymethod, my: {weight: 0.5}}" in recipe

    project = tmp_path / "project"
    tiny_project(project, {"train": {**STAGE_RUN, "episode_size": 16, "batch_size": 8},
                       "runs": {"mine": {"method": "mymethod", "my": {"weight": 0.5}}}}, n=8)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO / "tests")])}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(src), str(project)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused:" in out.stdout and "my.weight must be > 0" in out.stdout, out.stdout
    steps, terms = re.search(r"steps: (\d+) terms: (.*)", out.stdout).groups()
    assert int(steps) == 2 and "mine" in terms, out.stdout
