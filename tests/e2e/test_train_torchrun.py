"""k-GPU runs, simulated on CPU: a run with ``gpu: 2`` launched by the train rule's command (``protoclip train
--config C --run R --resume``) takes 2 (fake) GPU slots and becomes ``torchrun --standalone --nproc_per_node 2``
with gloo ranks. It must train the same weights as a 1-process run of the same global batch, and resume after
SIGKILL like a 1-process run.

Tolerance. With the global batch B split B/2 per rank, the math is the same; what differs is the order of
float32 reductions: DDP's all-reduce averages two half-batch gradients (instead of one sum over B), the towers'
matmuls run on B/2 rows, and the contrastive logits are assembled from all-gathered halves: ~1e-7 relative per
step. Adam would magnify one such difference on a gradient that is zero in exact arithmetic (attention's key bias:
softmax is shift-invariant, so its gradient is pure rounding noise) into a +-lr step, 1.9e-3 after 8 steps at
Adam's eps 1e-8 (measured); with eps 1e-4 here the noise stays noise and the weights agree to 2.7e-7 (CLIP)
and 5.9e-7 (ProtoCLIP; measured max |diff|, printed by the check), asserted at atol 1e-5 / rtol 1e-4. BatchNorm would be the one real
difference (per-rank batch statistics, as open_clip without --use-bn-sync), so the towers here have none:
tiny-vit (LayerNorm) with single-Linear heads. Images are uniform colours, so the random-resized-crop of the
"none" augmentation (drawn from each process's own RNG) gives the same pixels in both runs.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from protoclip.jobs.gpu_slots import GpuSlotsConfig, try_acquire
from testkit.processes import alive, project_env
from testkit.tmpdirs import module_folder
from testkit.training import tiny_project

RUN = {"model": "tiny-vit", "image_size": 32, "head_hidden": 0, "head_out": 16, "augmentation": "none",
       "epochs": 2.0, "episode_size": 16, "batch_size": 8, "warmup_episodes": 1, "lr": 1e-3,
       "eps": 1e-4, "lock_image_epoch": None, "num_workers": 0, "device": "cpu", "teacher": None, "seed": 0,
       "checkpoint_interval_s": 0.0, "early_stop": {"enabled": False},
       "kmeans": {"backend": "torch", "images_per_prototype": 4, "iters": 3}}
ATOL, RTOL = 1e-5, 1e-4


def project(tmp_path: Path) -> Path:
    """32 train + 4 held-out pairs of uniform-colour 32 px PNGs; runs of CLIP / ProtoCLIP on 1 and 2 GPUs."""
    runs = {}
    for method in ("clip", "protoclip"):
        for k in (1, 2):
            runs[f"{method}_{k}"] = {"method": method, "gpu": k}
    runs["protoclip_2k"] = {"method": "protoclip", "gpu": 2}  # the one killed and resumed
    return tiny_project(tmp_path, {"gpus": {"ids": [0, 1], "lock_dir": str(tmp_path / "locks"), "poll_s": 0.1},
                                   "train": RUN, "runs": runs},  # 2 fake GPUs
                        n=36, heldout=4, size=32, images="colour")


def train_cmd(config: Path, run: str) -> list[str]:
    """The train rule's command (protoclip.dag.stages.train_stage), run with this interpreter."""
    return [sys.executable, "-m", "protoclip.cli", "train", "--config", str(config), "--run", run, "--resume"]


@pytest.fixture(scope="module")
def config(tmp_path_factory, request) -> Iterator[Path]:
    """One project for the module: the resume test reuses the uninterrupted 2-rank ProtoCLIP run (removed after
    the module when its tests passed)."""
    with module_folder(tmp_path_factory, request, "torchrun") as root:
        yield project(root)


def trained(config: Path, run: str) -> subprocess.CompletedProcess | None:
    """Train ``run`` unless an earlier test of the module did."""
    if (config.parent / "results" / "runs" / run / "model.pt").exists():
        return None
    return train(config, run)


def train(config: Path, run: str) -> subprocess.CompletedProcess:
    done = subprocess.run(train_cmd(config, run), env=project_env(), cwd=config.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def weights(tmp_path: Path, run: str) -> dict[str, torch.Tensor]:
    from protoclip.models import load_model

    model, _ = load_model(tmp_path / "results" / "runs" / run / "model.pt")
    return model.state_dict()


def assert_same_weights(a: dict, b: dict, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert a.keys() == b.keys()
    worst = max(((a[k].float() - b[k].float()).abs().max().item(), k) for k in a)
    print("max |diff|:", worst)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=lambda m: f"{k}: {m} (worst {worst})")


def start_record(tmp_path: Path, run: str) -> dict:
    from protoclip.files.records import read_train_log

    return read_train_log(tmp_path / "results" / "runs" / run / "train_log.jsonl", "start")[-1]


@pytest.mark.parametrize("method", ["clip", "protoclip"])
def test_two_ranks_through_torchrun_train_the_one_process_weights(config, method):
    tmp_path = config.parent
    train(config, f"{method}_1")
    two = train(config, f"{method}_2")
    assert "torch.distributed.run --standalone --nproc_per_node=2" in two.stderr  # the launcher ran torchrun
    assert "CUDA_VISIBLE_DEVICES=0,1" in two.stderr
    s1, s2 = start_record(tmp_path, f"{method}_1")["schedule"], start_record(tmp_path, f"{method}_2")["schedule"]
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert s1["steps_per_episode"] == s2["steps_per_episode"] == 2 and s1["n_episodes"] == s2["n_episodes"] == 4
    w1, w2 = weights(tmp_path, f"{method}_1"), weights(tmp_path, f"{method}_2")
    assert_same_weights(w1, w2)
    assert (tmp_path / "locks" / "gpu0.slot0.lock").exists()  # the 2-GPU run held fake GPUs 0 and 1


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc: torchrun's ranks are children of its agent)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def test_two_rank_protoclip_resumes_after_sigkill_like_one_process(config):
    tmp_path = config.parent
    trained(config, "protoclip_2")  # uninterrupted
    ckpt = tmp_path / "results" / "runs" / "protoclip_2k" / "checkpoints" / "last.pt"
    proc = subprocess.Popen(train_cmd(config, "protoclip_2k"), env=project_env(), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 240
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        assert ckpt.exists(), "no checkpoint before the run ended"
        ranks = children(proc.pid)
    finally:
        # SIGKILL of the launcher only (it holds the slots and is torchrun's agent; torchrun starts each rank
        # in a session of its own): the ranks must die with it, not train on as orphans on freed GPUs
        proc.kill()
        proc.wait()
    # orphans would go on training: still alive here, or (fast machine) done and model.pt written below
    end = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < end:
        time.sleep(0.05)
    assert len(ranks) >= 2 and not any(alive(p) for p in ranks)
    slots = GpuSlotsConfig(ids=[0, 1], lock_dir=str(tmp_path / "locks"))
    assert try_acquire(slots, 2, ["0", "1"]) is not None  # both fake GPUs free again
    assert not (tmp_path / "results" / "runs" / "protoclip_2k" / "model.pt").exists()  # killed mid-run
    resumed = train(config, "protoclip_2k")  # the same command: --resume continues the checkpoint
    assert "resumed protoclip_2k at episode" in resumed.stderr
    # the resumed run trains what the uninterrupted one did (same ranks: the same reductions)
    assert_same_weights(weights(tmp_path, "protoclip_2"), weights(tmp_path, "protoclip_2k"), atol=1e-6, rtol=1e-5)
