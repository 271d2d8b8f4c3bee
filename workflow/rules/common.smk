# Shared by every rule: the validated project config (protoclip.config: unknown keys and wrong types stop
# here, before any job runs) and the stage commands, built by protoclip.pipeline exactly as in dvc.yaml.
import json

from protoclip.config import load_config, to_dict
from protoclip.layout import Layout
from protoclip import pipeline

# `--configfile X` on the command line comes first in this list, before the Snakefile's default
CONFIG_FILE = str(workflow.configfiles[0]) if workflow.configfiles else "config/config.yaml"
PROJECT = load_config(CONFIG_FILE)
LAYOUT = Layout.from_config(PROJECT)
RUNS = PROJECT.run_names()
TEACHERS = pipeline.teachers(PROJECT)


def cli(stage: str, args: str = "") -> str:
    return pipeline.stage_command(stage, CONFIG_FILE, args)


def run_teacher(run: str) -> str | None:
    return pipeline.run_teacher(PROJECT, run)


def train_inputs(wildcards):
    """Manifest, plus the teacher cache when the run has an external teacher term."""
    inputs = {"manifest": str(LAYOUT.manifest)}
    teacher = run_teacher(wildcards.run)
    if teacher:
        inputs["teacher"] = str(LAYOUT.teacher_features(teacher))
    return inputs


# teacher cache file stem -> teacher name (names with '/' become single path components)
TEACHER_BY_FILE = {LAYOUT.teacher_features(t).stem: t for t in TEACHERS}


def settings(obj) -> str:
    """A config section as canonical JSON: used as a rule param, so that editing it reruns the rule."""
    return json.dumps(to_dict(obj), sort_keys=True)
