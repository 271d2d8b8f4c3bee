"""Config of the `prepare` stage (owned by protoclip.data)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from protoclip.config.protocols import Project


@dataclass
class UserDataConfig:
    """Image-text pairs a user already has, in open_clip's formats."""
    name: str  # becomes the `source` column and the sample-id prefix
    format: Literal["csv", "tsv", "wds"]  # CSV/TSV (filepath, caption columns) or webdataset tar shards
    path: str  # CSV/TSV file, or a shard pattern such as /data/cc3m/{00000..00331}.tar
    img_key: str = "filepath"  # CSV/TSV column of image paths (relative paths resolve against the file's folder)
    caption_key: str = "caption"  # CSV/TSV column of captions
    # CSV/TSV column of coarse labels (class names, folders ...: the held-out pairs' zero-shot and linear
    # probes, as the offline sources' labels); null: the pairs are unlabelled (retrieval only)
    label_key: str | None = None
    split: Literal["train", "heldout", "auto"] = "auto"  # auto: split with the same seeded rule as the default data
    # CSV/TSV: a quoted caption may span lines (RFC 4180, as pandas reads it for open_clip); false: one record a line
    multiline_captions: bool = True
    # a quoted field still open after this many lines, or this many characters, is taken for a quote left open:
    # its first line is dropped, the lines after it are read as rows (protoclip.data.corpus.csvfile)
    quote_max_lines: int = 8
    quote_max_chars: int = 131_072  # the longest caption kept (longer ones are dropped as caption_too_long)
    # keep a seeded random subset of at most this many of the set's pairs (after the drops and de-duplication):
    # those with the smallest hash of (prepare.seed, id), so it does not depend on shard order or workers and a
    # larger cap keeps a superset (ProtoCLIP's "a 2,500,000 subset" of CC); null = every pair
    max_pairs: int | None = None


@dataclass
class PrepareConfig:
    image_size: int = 64  # rendered/resized side in px (64 on CPU; 224 for GPU runs)
    heldout_fraction: float = 0.1  # share of caption pairs held out for retrieval / coarse-label probes
    seed: int = 0  # fixed seed of the train / held-out split
    strict_hashes: bool = False  # a .deb whose sha256 differs from the pinned one: warn (False) or fail (True)
    offline_sources: list[Literal["tuxpaint", "openclipart", "emoji"]] = field(
        default_factory=lambda: ["tuxpaint", "openclipart", "emoji"])  # packaged caption corpora to build
    eval_sets: list[Literal["fashion_mnist", "digits"]] = field(
        default_factory=lambda: ["fashion_mnist", "digits"])  # offline labelled evaluation sets
    user_data: list[UserDataConfig] = field(default_factory=list)  # extra pretraining pairs from user paths
    num_workers: int = 2  # processes for rendering SVGs and scanning webdataset shards
    # openclipart cleaning thresholds (shared/docs/offline-data.md)
    openclipart_max_title_uses: int = 5  # a title used by more files than this names a collection: dropped
    openclipart_max_keywords: int = 3  # keywords appended to an openclipart title in its caption

    def validate(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        names = [u.name for u in self.user_data]
        for u in self.user_data:
            if u.label_key and u.format == "wds":
                raise ValueError(f"user_data '{u.name}': label_key applies to csv/tsv files, not wds shards")
            if u.max_pairs is not None and u.max_pairs < 1:
                raise ValueError(f"user_data '{u.name}': max_pairs must be >= 1 or null, got {u.max_pairs}")
            if u.quote_max_lines < 1 or u.quote_max_chars < 1:
                raise ValueError(f"user_data '{u.name}': quote_max_lines and quote_max_chars must be >= 1, got "
                                 f"{u.quote_max_lines} and {u.quote_max_chars}")
        if len(set(names)) != len(names) or set(names) & set(self.offline_sources):
            raise ValueError(f"user_data names must be unique and differ from offline sources, got {names}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {self.image_size}")
        if self.openclipart_max_title_uses < 1 or self.openclipart_max_keywords < 0:
            raise ValueError("openclipart_max_title_uses must be >= 1 and openclipart_max_keywords >= 0")


@runtime_checkable
class PrepareProject(Project, Protocol):
    """The project config as the prepare stage reads it (protoclip.project.ProjectConfig; see protoclip.config.protocols)."""

    @property
    def prepare(self) -> PrepareConfig: ...
