"""Two of the paper's zero-shot sets (Table VI) ship in layouts no image reader takes; these commands turn the
user's download into class-per-folder trees that ``kind: folder`` reads (``protoclip.evaluate.datasets.folder``):

    protoclip birdsnap --src /data/birdsnap --out data/external/birdsnap
    protoclip ucf101 --src /data/ucf101 --out data/external/ucf101 [--split 1] [--train]
"""
from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

from tqdm import tqdm

from protoclip.files.atomic import durable_replace
from protoclip.errors import UserError, import_extra


class SourceDataError(UserError):
    """The user's download of a set lacks a file or has one that cannot be read; the message names it."""

    kind = "data error"


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise SourceDataError(f"{path}: not found ({what})")
    return path


def _tsv(path: Path) -> list[dict[str, str]]:
    with open(_need(path, "Birdsnap's tab-separated list"), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _link(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def prepare_birdsnap(src: str | Path, out: str | Path, images: str | Path | None = None) -> dict:
    """Birdsnap's lists -> ``out/{train,test}/<species dir>/``; returns (and writes to ``out/birdsnap.json``) the
    counts.

    ``src``: ``birdsnap.tgz`` unpacked (``species.txt``, ``images.txt``, ``test_images.txt``); ``images``: what its
    ``get_birdsnap.py`` downloaded (default ``download/images/``). Every image listed in ``test_images.txt`` goes
    to ``out/test/<species dir>/``, the others to ``out/train/<species dir>/`` (hard links when on the same file
    system, else copies). Images that are no longer online are counted, not invented; species left without a test
    image are dropped by the reader with a warning (as the ProtoCLIP code drops CLOOB's empty classes). A missing
    list file stops with one line naming it (:class:`SourceDataError`).
    """
    src, out = Path(src), Path(out)
    species = {int(r["id"]): r["dir"] for r in _tsv(src / "species.txt")}
    rows = _tsv(src / "images.txt")
    test = {line.strip() for line in _need(src / "test_images.txt", "Birdsnap's test list").read_text().splitlines()[1:]
            if line.strip()}
    if images is None:
        images = next((p for p in (src / "download" / "images", src / "images") if p.is_dir()), None)
        if images is None:
            raise SourceDataError(f"{src / 'download' / 'images'}: not found (the images get_birdsnap.py downloads; "
                                  "or give --images)")
    images = Path(images)
    counts = {"train": 0, "test": 0, "missing_train": 0, "missing_test": 0}
    for row in tqdm(rows, desc="birdsnap", unit="img"):
        split = "test" if row["path"] in test else "train"
        file = images / row["path"]
        if not file.is_file():
            counts[f"missing_{split}"] += 1
            continue
        try:
            folder = species[int(row["species_id"])]
        except (KeyError, ValueError):
            raise SourceDataError(f"{src / 'images.txt'}: species_id {row.get('species_id')!r} of {row['path']} is "
                                  "not in species.txt") from None
        _link(file, out / split / folder / Path(row["path"]).name)
        counts[split] += 1
    if counts["test"] == 0:
        raise SourceDataError(f"{images}: none of the {len(test)} test images of test_images.txt is there")
    counts["species_with_test_images"] = sum(1 for d in (out / "test").iterdir() if d.is_dir())
    (out / "birdsnap.json").write_text(json.dumps(counts, indent=1) + "\n")
    return counts


def middle_frame(video: Path):
    """The middle frame (index n // 2 of the n decoded frames) of a video, as an RGB PIL image."""
    av = import_extra("av", "ucf101", "protoclip ucf101")  # PyAV (~100 MB with FFmpeg): this command's extra

    try:
        with av.open(str(video)) as container:
            frames = [f for f in container.decode(video=0)]
            if not frames:
                raise SourceDataError(f"{video}: no video frames")
            return frames[len(frames) // 2].to_image().convert("RGB")
    except av.error.FFmpegError as err:
        raise SourceDataError(f"{video}: cannot decode the video ({type(err).__name__}: {err})") from None


def prepare_ucf101(src: str | Path, out: str | Path, split: int = 1, train: bool = False,
                   videos: str | Path | None = None, lists: str | Path | None = None) -> dict:
    """UCF101's split lists + videos -> ``out/{testlist0k,trainlist0k}/<Class>/<video>.jpg`` (middle frames).

    ``src``: ``UCF101.rar`` -> ``UCF-101/<Class>/*.avi`` and ``UCF101TrainTestSplits-RecognitionTask.zip`` ->
    ``ucfTrainTestlist/``. The middle frame of each video of ``testlist0<k>.txt`` (and with ``train`` of
    ``trainlist0<k>.txt``): CLIP's protocol ("we use the middle frame of each video clip", Radford et al. 2021,
    arXiv:2103.00020, Appendix A.1), and the layout of CLOOB's processed UCF101 that the ProtoCLIP code reads
    (``ucf101/testlist01``). Videos are decoded with PyAV (FFmpeg). A missing list file, video or undecodable
    video stops with one line naming it (:class:`SourceDataError`).
    """
    import_extra("av", "ucf101", "protoclip ucf101")  # stop before any work when PyAV is missing
    src, out = Path(src), Path(out)
    videos = Path(videos) if videos else src / "UCF-101"
    lists = Path(lists) if lists else src / "ucfTrainTestlist"
    _need(videos, "UCF101's videos, UCF-101/<Class>/*.avi")
    counts = {}
    for name in [f"testlist0{split}"] + ([f"trainlist0{split}"] if train else []):
        entries = [line.split()[0] for line in _need(lists / f"{name}.txt", "UCF101's split list").read_text()
                   .splitlines() if line.strip()]
        for rel in tqdm(entries, desc=name, unit="video"):
            video = videos / rel
            dst = out / name / Path(rel).parent.name / f"{Path(rel).stem}.jpg"
            if dst.exists():
                continue
            _need(video, f"listed in {lists / (name + '.txt')}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_suffix(".tmp.jpg")
            middle_frame(video).save(tmp, quality=95)
            durable_replace(tmp, dst)  # a killed run (or a power cut) leaves no half-written frame
        counts[name] = len(entries)
    (out / "ucf101.json").write_text(json.dumps({"split": split, **counts}, indent=1) + "\n")
    return counts


# --------------------------------------------------------------------------- `protoclip birdsnap` / `ucf101`
def add_arguments(p, name: str) -> None:
    if name == "birdsnap":
        p.add_argument("--src", required=True, help="folder with species.txt, images.txt, test_images.txt")
        p.add_argument("--images", help="the downloaded images (default: <src>/download/images)")
        p.add_argument("--out", required=True, help="output folder (the set's `path`)")
        return
    p.add_argument("--src", required=True, help="folder with UCF-101/ and ucfTrainTestlist/")
    p.add_argument("--out", required=True, help="output folder (the set's `path`)")
    p.add_argument("--split", type=int, default=1, choices=(1, 2, 3), help="official split (CLIP, ProtoCLIP: 1)")
    p.add_argument("--train", action="store_true", help="also the training videos (only the probes read them)")


def main(args) -> int:
    if args.stage == "birdsnap":
        counts = prepare_birdsnap(args.src, args.out, args.images)
    else:
        counts = prepare_ucf101(args.src, args.out, args.split, args.train)
    print(f"protoclip {args.stage}: wrote {args.out}: {counts}")
    return 0
