"""Strict config loading: unknown keys, wrong types and missing paths stop with key and file named."""
import os
from pathlib import Path

import pytest
import yaml

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.train.config import TrainConfig
from testkit import REPO


def write(tmp_path: Path, data: dict, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_config_is_valid_and_defines_runs():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert {"clip_tiny_s0", "protoclip_tiny_s2"} <= set(cfg.run_names())  # main runs: 3 seeds each
    clip, proto = cfg.run("clip_tiny_s0"), cfg.run("protoclip_tiny_s2")
    assert clip.method == "clip" and proto.method == "protoclip" and proto.seed == 2
    assert clip.name == "clip_tiny_s0"
    # overrides win, untouched defaults come from the paper's Table I
    assert proto.episode_size == 1024 and proto.weight_decay == 0.5 and proto.loss.tau_y == 0.01


def test_the_offline_default_extracts_at_the_training_batch_and_the_paper_at_twice():
    """The offline default's extraction pass takes the training batch (on one CPU thread a larger one is no
    faster, and its features keep the rounding of the training-size batches); the paper runs leave it null:
    twice the batch on the GPU (run_loader)."""
    offline = load_config(REPO / "config" / "config.yaml")
    assert all(offline.run(n).extract_batch_size == offline.run(n).batch_size for n in offline.run_names())
    paper = load_config(REPO / "config" / "paper.yaml")
    assert all(paper.run(n).extract_batch_size is None for n in paper.run_names())


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, {"prepare": {"image_sise": 64}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "image_sise" in str(err.value) and str(path) in str(err.value)
    assert "prepare.image_sise" in str(err.value)


def test_wrong_type_names_key_and_file(tmp_path):
    path = write(tmp_path, {"teacher": {"pca_dim": "sixty-four"}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "teacher.pca_dim" in msg and "int" in msg and str(path) in msg


def test_bool_is_not_an_int_and_int_is_a_float(tmp_path):
    with pytest.raises(ConfigError, match="train.batch_size"):
        load_config(write(tmp_path, {"train": {"batch_size": True}}))
    cfg = load_config(write(tmp_path, {"train": {"lr": 1}}, "ok.yaml"))
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


def test_literal_choice_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="augmentation"):
        load_config(write(tmp_path, {"train": {"augmentation": "heavy"}}))


def test_run_overrides_are_validated_with_their_file(tmp_path):
    exp = write(tmp_path, {"runs": {"bad": {"loss": {"tau_why": 0.1}}}}, "exp.yaml")
    path = write(tmp_path, {"experiments": [exp.name]})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "loss.tau_why" in str(err.value) and "exp.yaml" in str(err.value) and "bad" in str(err.value)


def test_duplicate_run_names_are_shared_when_identical_else_an_error(tmp_path):
    a = write(tmp_path, {"runs": {"r": {"method": "clip"}}}, "a.yaml")
    b = write(tmp_path, {"runs": {"r": {"method": "clip"}}}, "b.yaml")
    assert load_config(write(tmp_path, {"experiments": [a.name, b.name]})).run_names() == ["r"]  # trained once
    c = write(tmp_path, {"runs": {"r": {"method": "clip", "epochs": 2}}}, "c.yaml")
    with pytest.raises(ConfigError, match="already defined differently"):
        load_config(write(tmp_path, {"experiments": [a.name, c.name]}))
    with pytest.raises(ConfigError, match="already defined"):  # an inline run may not repeat a file's
        load_config(write(tmp_path, {"experiments": [a.name], "runs": {"r": {"method": "clip"}}}))


def test_a_runs_own_warmup_beats_the_file_level_one_in_either_unit(tmp_path):
    """The nearer level wins even where two keys set the warm-up: a file-level warmup_samples (which the schedule
    prefers) must not override a run's warmup_episodes; the schedule then counts the run's unit."""
    from protoclip.train.schedule import Schedule

    exp = write(tmp_path, {"runs": {"episodes": {"warmup_episodes": 3}, "samples": {"warmup_samples": 640},
                                    "inherits": {"epochs": 2}}}, "exp.yaml")
    cfg = load_config(write(tmp_path, {"experiments": [exp.name], "train": {"warmup_samples": 6400}}))
    got = {n: (cfg.run(n).warmup_episodes, cfg.run(n).warmup_samples) for n in cfg.run_names()}
    assert got == {"episodes": (3, None), "samples": (40, 640), "inherits": (40, 6400)}
    steps = {}
    for n in cfg.run_names():  # 1000 pairs, episodes of 200, batch 64: 4 steps per episode
        r = cfg.run(n)
        steps[n] = Schedule.build(base_lr=1.0, epochs=4, dataset_size=1000, episode_size=200, batch_size=64,
                                  warmup_episodes=r.warmup_episodes, lock_image_epoch=None,
                                  warmup_samples=r.warmup_samples).warmup_steps
    assert steps == {"episodes": 3 * 4, "samples": 10, "inherits": 100}  # ceil(640 / 64), ceil(6400 / 64)
    # train_force is the nearest level: its episodes beat both the file's and a run's samples
    cfg = load_config(write(tmp_path, {"experiments": [exp.name], "train": {"warmup_samples": 6400},
                                       "train_force": {"warmup_episodes": 1}}))
    assert {(cfg.run(n).warmup_episodes, cfg.run(n).warmup_samples) for n in cfg.run_names()} == {(1, None)}


@pytest.mark.parametrize("level", ["train", "run", "train_force"])
def test_two_keys_for_one_quantity_at_one_level_stop_naming_both(tmp_path, level):
    both = {"warmup_episodes": 2, "warmup_samples": 100}
    exp = write(tmp_path, {"runs": {"r": both if level == "run" else {"epochs": 2}}}, "exp.yaml")
    data = {"experiments": [exp.name], **({level: both} if level != "run" else {})}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    msg = str(err.value)
    assert "warmup_episodes and warmup_samples" in msg and "same quantity" in msg
    assert ("exp.yaml: run 'r'" if level == "run" else f"config.yaml: {level}") in msg
    # a null is not a setting: clearing one unit beside the other loads
    exp = write(tmp_path, {"runs": {"r": {"warmup_episodes": 2, "warmup_samples": None}}}, "exp.yaml")
    assert load_config(write(tmp_path, {"experiments": [exp.name]})).run("r").warmup_episodes == 2


def test_missing_config_or_experiment_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="input path not found.*nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="missing_exp.yaml"):
        load_config(write(tmp_path, {"experiments": ["missing_exp.yaml"]}))


def test_nested_dataclass_and_validate_hook(tmp_path):
    cfg = load_config(write(tmp_path, {"runs": {"r": {"kmeans": {"iters": 5}, "method": "clip"}}}))
    rc = cfg.run("r")
    assert isinstance(rc, TrainConfig) and rc.kmeans.iters == 5 and rc.kmeans.images_per_prototype == 10
    with pytest.raises(ConfigError, match="heldout_fraction"):
        load_config(write(tmp_path, {"prepare": {"heldout_fraction": 1.5}}, "bad.yaml"))


def test_unknown_run_is_an_error():
    cfg = load_config(REPO / "config" / "config.yaml")
    with pytest.raises(ConfigError, match="unknown run 'nope'"):
        cfg.run("nope")


def test_cli_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    from protoclip.cli import main

    path = write(tmp_path, {"paths": {"data_dirr": "x"}})
    assert main(["runs", "--config", str(path)]) == 2
    assert "paths.data_dirr" in capsys.readouterr().err


def test_paper_configs_validate():
    cfg = load_config(REPO / "config" / "paper.yaml")
    t3 = cfg.run("t3_no_roberta_no_pbt")
    assert t3.model == "RN50" and t3.teacher is None and t3.loss.pbt is False and t3.epochs == 8
    assert cfg.run("t3_no_roberta_no_kmeans").kmeans.init == "random"
    assert cfg.run("f6b_tau_y_0.02").loss.tau_y == 0.02 and cfg.run("f6b_tau_y_0.02").loss.clip_weight == 0.0
    assert cfg.run("t4_clip_32ep").lock_image_epoch == 16 and cfg.run("t4_clip_32ep").method == "clip"


def test_run_data_must_name_a_source(tmp_path):
    path = write(tmp_path, {"runs": {"r": {"method": "clip", "data": ["cc3m"]}}})
    with pytest.raises(ConfigError, match="'cc3m'.*user_data"):
        load_config(path)


def test_cli_reports_a_missing_user_data_path(tmp_path, capsys):
    from protoclip.cli import main

    path = write(tmp_path, {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "res")},
                            "prepare": {"offline_sources": [], "eval_sets": [],
                                        "user_data": [{"name": "mine", "format": "csv",
                                                       "path": str(tmp_path / "missing.csv")}]}})
    assert main(["prepare", "--config", str(path)]) == 2
    assert str(tmp_path / "missing.csv") in capsys.readouterr().err


def write_text(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_numbers_without_a_dot_are_numbers(tmp_path):
    # PyYAML (YAML 1.1) loads 1e9 and 5e-4 as strings; the config must read them as the user meant
    assert yaml.safe_load("x: 1e9")["x"] == "1e9"  # the premise of the fix
    cfg = load_config(write_text(tmp_path, "train:\n  grad_clip: 1e9\n  lr: 5e-4\n  episode_size: 2e5\n"
                                           "  batch_size: 1_024\n"))
    assert cfg.train.grad_clip == 1e9 and cfg.train.lr == 5e-4
    assert cfg.train.episode_size == 200_000 and isinstance(cfg.train.episode_size, int)
    assert cfg.train.batch_size == 1024
    with pytest.raises(ConfigError, match="'train.episode_size' must be an integer"):
        load_config(write_text(tmp_path, "train:\n  episode_size: 2.5e-1\n", "frac.yaml"))
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(write_text(tmp_path, "train:\n  lr: 1e9x\n", "junk.yaml"))
    # a string field keeps what was written (train.model is a string too, but must name an open_clip config)
    cfg = load_config(write_text(tmp_path, "paths:\n  mlflow_experiment: 1e9\n", "str.yaml"))
    assert cfg.paths.mlflow_experiment == "1e9"


@pytest.mark.parametrize("text,key", [
    ("train:\n  epochs: .nan\n", "train.epochs"),
    ("train:\n  lr: .inf\n", "train.lr"),
    ("train:\n  loss:\n    tau_y: -.inf\n", "train.loss.tau_y"),
    ("train:\n  lock_image_epoch: .nan\n", "train.lock_image_epoch"),
    ("train:\n  episode_size: .inf\n", "train.episode_size"),
    ("train:\n  lr: 'nan'\n", "train.lr"),
])
def test_non_finite_numbers_are_rejected_naming_the_key(tmp_path, text, key):
    path = write_text(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"'{key}'" in msg and "finite" in msg and str(path) in msg


def test_progress_bars_update_every_30s_in_log_files(monkeypatch):
    """Rule logs (`| tee`) are not terminals: the CLI sets TQDM_MININTERVAL before tqdm is imported (tqdm reads
    TQDM_* defaults at import), so a log holds a few progress frames instead of ten per second."""
    import io
    import subprocess
    import sys

    from protoclip.jobs.launch import progress_for_logs

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    assert not progress_for_logs(Tty()) and "TQDM_MININTERVAL" not in os.environ
    snippet = ("from protoclip.jobs.launch import progress_for_logs; progress_for_logs(); import time; from tqdm import tqdm\n"
               "for _ in tqdm(range(20)): time.sleep(0.02)")  # 0.4 s of work, the bar on stderr (a pipe here)

    def frames(**env) -> int:
        out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True,
                             env={**os.environ, **env})
        return out.stderr.count("it/s]")  # one per frame (text mode turns the frames' \r into newlines)

    assert frames() <= 3  # the first and the final frame only
    assert frames(TQDM_MININTERVAL="0.01") >= 10  # a user's own setting wins: frequent updates, as logs had before


@pytest.mark.parametrize("section,key,value,message", [
    ("nclip", "lambda1", -0.1, "'r'): nclip.lambda1, lambda2, weight and clip_weight must be >= 0"),
    ("nclip", "clip_weight", -1.0, "'r'): nclip.lambda1, lambda2, weight and clip_weight must be >= 0"),
    ("pcl", "tau", 0.0, "'r'): pcl.tau, phi_alpha must be > 0"),
    ("pcl", "momentum", 1.5, "momentum in [0, 1]"),
    ("pcl", "num_clusters", [], "'r'): pcl.num_clusters and samples_per_cluster must be non-empty"),
    ("pcl", "samples_per_cluster", [0.5], "'r'): pcl.num_clusters and samples_per_cluster must be non-empty"),
    ("pcl", "kmeans_redo", 0, "kmeans_iters and kmeans_redo >= 1"),
])
def test_method_owned_sections_are_checked_for_every_run(tmp_path, section, key, value, message):
    """``nclip`` / ``pcl`` are defined in their method modules (train/methods/nclip.py, pcl.py), registered with
    the methods and checked when the config loads for every run, whatever its method; the nearest good value
    loads."""
    from protoclip.train.methods.nclip import NCLIPConfig
    from protoclip.train.methods.pcl import PCLConfig

    assert {"nclip": NCLIPConfig, "pcl": PCLConfig}[section] is type(getattr(TrainConfig(), section))
    path = write(tmp_path, {"runs": {"r": {"method": "clip", section: {key: value}}}})
    with pytest.raises(ConfigError) as err:
        load_config(path).run("r")
    assert message in str(err.value) and str(path) in str(err.value)
    good = {"lambda1": 0.0, "clip_weight": 0.0, "tau": 0.01, "momentum": 1.0, "num_clusters": [1],
            "samples_per_cluster": [1.0], "kmeans_redo": 1}[key]
    path = write(tmp_path, {"runs": {"r": {"method": "clip", section: {key: good}}}}, "good.yaml")
    assert getattr(getattr(load_config(path).run("r"), section), key) == good


def test_the_strict_loader_reads_every_shipped_config_as_pyyamls_pure_python_safe_loader_does():
    """StrictLoader parses with libyaml where PyYAML has it (every job reads the config through it): each YAML
    file under config/ gives the same data as yaml.SafeLoader's pure-Python parser."""
    from protoclip.config.strict import StrictLoader

    files = sorted((REPO / "config").rglob("*.yaml"))
    assert len(files) > 20
    if yaml.__with_libyaml__:
        assert issubclass(StrictLoader, yaml.CSafeLoader)
    for f in files:
        text = f.read_text()
        assert yaml.load(text, Loader=StrictLoader) == yaml.load(text, Loader=yaml.SafeLoader), f


def test_a_runs_budget_and_warmup_in_steps_replace_the_file_levels_other_units(tmp_path):
    """`steps` and `epochs` are one quantity, as are the three warm-up units: a run's own unit wins over its file's
    `train:` default in another unit, and one level naming two stops."""
    from protoclip.train.schedule import Schedule

    exp = write(tmp_path, {"runs": {"iters": {"steps": 30, "warmup_steps": 5}, "inherits": {}}}, "exp.yaml")
    cfg = load_config(write(tmp_path, {"experiments": [exp.name], "train": {"epochs": 3, "warmup_samples": 640}}))
    it, inh = cfg.run("iters"), cfg.run("inherits")
    assert (it.steps, it.warmup_steps, it.warmup_samples) == (30, 5, None)
    assert (inh.steps, inh.epochs, inh.warmup_steps, inh.warmup_samples) == (None, 3, None, 640)
    s = Schedule.from_config(it, dataset_size=1000)
    assert (s.total_steps, s.warmup_steps) == (30, 5)
    for both in ({"epochs": 2, "steps": 10}, {"warmup_samples": 100, "warmup_steps": 2}):
        exp = write(tmp_path, {"runs": {"r": both}}, "exp.yaml")
        with pytest.raises(ConfigError, match=f"{' and '.join(both)} both set the same quantity"):
            load_config(write(tmp_path, {"experiments": [exp.name]}))


@pytest.mark.parametrize("keys, message", [
    ({"optimizer": "lamb"}, "'optimizer' must be 'adamw' | 'sgd'"),
    ({"lr_schedule": "linear"}, "'lr_schedule' must be 'cosine' | 'step'"),
    ({"optimizer": "sgd", "momentum": 1.0}, r"momentum must be in \[0, 1\)"),
    ({"momentum": -0.1}, r"momentum must be in \[0, 1\)"),
    ({"lr_schedule": "step", "lr_milestones": [160, 120]}, "lr_milestones must be epochs > 0 in increasing order"),
    ({"lr_schedule": "step", "lr_milestones": [120, 120]}, "increasing order"),
    ({"lr_schedule": "step"}, "lr_schedule: step needs lr_milestones"),
    ({"lr_milestones": [120]}, "read by lr_schedule: step only"),
    ({"lr_schedule": "step", "lr_milestones": [1], "lr_gamma": 0.0}, r"lr_gamma must be in \(0, 1\]"),
    ({"steps": 0}, "steps .* must be > 0"),
    ({"steps": -5}, "steps .* must be > 0"),
    ({"warmup_steps": -1}, "warmup_steps .* must be >= 0"),
    ({"min_lr": 1.0}, r"min_lr must be in \[0, lr\)"),
    ({"lr_schedule": "step", "lr_milestones": [1], "min_lr": 1e-6}, "0 with lr_schedule: step"),
])
def test_optimizer_and_schedule_keys_are_checked_naming_the_key(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, {"runs": {"r": {"method": "clip", **keys}}}))
    sgd = load_config(write(tmp_path, {"runs": {"r": {"optimizer": "sgd", "momentum": 0.0, "lr_schedule": "step",
                                                     "lr_milestones": [2.5, 4]}}})).run("r")
    assert (sgd.optimizer, sgd.momentum, sgd.lr_milestones, sgd.lr_gamma) == ("sgd", 0.0, [2.5, 4.0], 0.1)
