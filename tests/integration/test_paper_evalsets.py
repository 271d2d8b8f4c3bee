"""`protoclip birdsnap` and `protoclip ucf101` on tiny fixtures in the layouts the sets ship in (Birdsnap's tab-
separated lists, UCF101's split lists and real .avi videos written here with PyAV), read back by `kind: folder`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from protoclip.data.corpus.paper_evalsets import middle_frame
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets import load_eval_set
from protoclip.files.layout import Layout
from testkit import REPO


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "protoclip.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


# --------------------------------------------------------------------------- Birdsnap
SPECIES = [(1, "Acadian Flycatcher", "Acadian_Flycatcher"), (2, "Allen's Hummingbird", "Allens_Hummingbird"),
           (3, "Blue Jay", "Blue_Jay"), (4, "Brown Pelican", "Brown_Pelican")]


def _birdsnap(src: Path) -> dict[str, int]:
    """Birdsnap 1.1's files: species.txt, images.txt (with the images get_birdsnap.py fetched), test_images.txt.
    Brown Pelican's images are no longer online (none downloaded). Returns grey level -> species id."""
    src.mkdir()
    (src / "species.txt").write_text("id\tcommon\tscientific\tdir\n" + "".join(
        f"{i}\t{c}\tGenus species{i}\t{d}\n" for i, c, d in SPECIES))
    rows, tests, grey = [], [], {}
    for i, _, d in SPECIES:
        for j in range(3):
            path = f"{d}/{100 * i + j}.jpg"
            rows.append(f"http://x/{i}{j}.jpg\tmd5\t{path}\t{i}\t1\t2\t3\t4")
            if j == 0:
                tests.append(path)
            if d != "Brown_Pelican":
                value = 40 * i + 10 * j
                grey[value] = i
                (src / "download" / "images" / d).mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(src / "download" / "images" / path,
                                                                          format="PNG")
    (src / "images.txt").write_text("url\tmd5\tpath\tspecies_id\tbb_x1\tbb_y1\tbb_x2\tbb_y2\n" + "\n".join(rows))
    (src / "test_images.txt").write_text("path\n" + "\n".join(tests) + "\n")
    return grey


def test_birdsnap_command_and_reader(tmp_path):
    grey = _birdsnap(tmp_path / "birdsnap")
    out = tmp_path / "external" / "birdsnap"
    res = _cli("birdsnap", "--src", str(tmp_path / "birdsnap"), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (out / "test").iterdir()) == ["Acadian_Flycatcher", "Allens_Hummingbird",
                                                                "Blue_Jay"]
    ds = load_eval_set("birdsnap", EvalDatasetConfig(kind="folder", path=str(out)), Layout(tmp_path))
    # the prompts' names of the species present (Allen's Hummingbird is CLIP's 'Allens Hummingbird'), in CLIP's order
    assert ds.classnames == ["Acadian Flycatcher", "Allens Hummingbird", "Blue Jay"]
    assert ds.templates == ["a photo of a {}, a type of bird."]
    names = {i: c for i, c, _ in SPECIES}
    for split, n in ((ds.test, 3), (ds.train, 6)):
        got = [(names[grey[int(np.asarray(img).mean())]], ds.classnames[y]) for img, y in split]
        assert len(got) == n and all(own.replace("'", "") == scored for own, scored in got), got
    assert '"missing_test": 1' in (out / "birdsnap.json").read_text()


def test_birdsnap_without_images_is_one_line(tmp_path):
    (tmp_path / "birdsnap").mkdir()
    (tmp_path / "birdsnap" / "species.txt").write_text("id\tcommon\tscientific\tdir\n")
    res = _cli("birdsnap", "--src", str(tmp_path / "birdsnap"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == f"protoclip birdsnap: data error: {tmp_path / 'birdsnap' / 'images.txt'}: not found " \
                                 "(Birdsnap's tab-separated list)"


# --------------------------------------------------------------------------- UCF101
def _video(path: Path, levels: list[int]) -> None:
    """A real (MPEG-4 in AVI) video whose frame i is a flat grey of levels[i]."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for level in levels:
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), level, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def test_middle_frame_of_a_real_video(tmp_path):
    _video(tmp_path / "v.avi", [10, 40, 70, 100, 130, 160, 190])  # 7 frames: the middle one is index 3
    assert abs(np.asarray(middle_frame(tmp_path / "v.avi")).mean() - 100) < 6
    _video(tmp_path / "w.avi", [10, 40, 70, 100])  # 4 frames: index 2
    assert abs(np.asarray(middle_frame(tmp_path / "w.avi")).mean() - 70) < 6


def test_ucf101_command_and_reader(tmp_path):
    src = tmp_path / "ucf"
    classes = ["ApplyEyeMakeup", "Archery", "YoYo"]
    lists = src / "ucfTrainTestlist"
    lists.mkdir(parents=True)
    (lists / "classInd.txt").write_text("".join(f"{i} {c}\n" for i, c in enumerate(classes, 1)))
    test_lines, train_lines = [], []
    for i, c in enumerate(classes):
        for g in (1, 8):
            rel = f"{c}/v_{c}_g{g:02d}_c01.avi"
            _video(src / "UCF-101" / rel, [5, 5, 60 * i + 20 + g, 250, 250])  # the middle frame names the class
            (test_lines if g == 1 else train_lines).append(rel)
    (lists / "testlist01.txt").write_text("\n".join(test_lines) + "\n")
    (lists / "trainlist01.txt").write_text("".join(f"{r} {classes.index(r.split('/')[0]) + 1}\n"
                                                   for r in train_lines))
    out = tmp_path / "external" / "ucf101"
    res = _cli("ucf101", "--src", str(src), "--out", str(out), "--train", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (out / "testlist01" / "Archery" / "v_Archery_g01_c01.jpg").is_file()
    ds = load_eval_set("ucf101", EvalDatasetConfig(kind="folder", path=str(out)), Layout(tmp_path))
    assert ds.classnames == ["Apply Eye Makeup", "Archery", "Yo Yo"]  # CLIP's names of the classes present
    for split, g in ((ds.test, 1), (ds.train, 8)):
        levels = [(int(np.asarray(img).mean()), y) for img, y in split]
        assert len(levels) == 3
        for level, y in levels:
            assert abs(level - (60 * y + 20 + g)) < 8, levels  # each middle frame scored as its own class
    (src / "UCF-101" / "YoYo" / "v_YoYo_g01_c01.avi").unlink()
    res = _cli("ucf101", "--src", str(src), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{src / 'UCF-101' / 'YoYo' / 'v_YoYo_g01_c01.avi'}: not found" in res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("data", [b"", b"RIFF not really an avi"])
def test_undecodable_video_is_one_line(data, tmp_path):
    from protoclip.errors import UserError

    (tmp_path / "x.avi").write_bytes(data)
    with pytest.raises(UserError) as err:
        middle_frame(tmp_path / "x.avi")
    assert str(err.value).startswith(f"{tmp_path / 'x.avi'}: ") and "\n" not in str(err.value)
