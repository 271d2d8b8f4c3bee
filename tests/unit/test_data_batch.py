"""The training batch (protoclip.data.loading.batch): the image form a transform declares decides how the items'
images are stacked, and the batch's fields are what the step reads (one tensor, a list of views, stored files)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from protoclip.data.loading.batch import Batch, collate
from protoclip.data.loading.transforms import EncodedImage, ImageForm, MultiView, image_form, train_transform


def items(n: int, views: int = 1):
    g = torch.Generator().manual_seed(0)
    img = lambda: torch.randint(0, 256, (3, 8, 8), generator=g, dtype=torch.uint8)  # noqa: E731
    return [(img() if views == 1 else tuple(img() for _ in range(views)), torch.arange(4) + i, 10 + i)
            for i in range(n)]


def test_the_form_is_the_one_the_transform_declares():
    assert image_form(train_transform(16, "protoclip")) == ImageForm()
    assert image_form(MultiView(train_transform(16), train_transform(16))) == ImageForm(views=2)
    assert image_form(train_transform(16, decode="device", photometric="device")) == ImageForm(stored=True)
    with pytest.raises(ValueError):
        ImageForm(views=2, stored=True)


def test_one_view_stacks_as_torchs_collate_and_the_step_reads_a_tensor():
    batch = collate(items(3), ImageForm())
    ref = default_collate(items(3))
    assert isinstance(batch, Batch) and len(batch) == 3 and not batch.multi and not batch.stored
    assert torch.equal(batch.images, ref[0]) and torch.equal(batch.tokens, ref[1])
    assert batch.positions.tolist() == [10, 11, 12] and batch.positions.dtype == torch.int64


def test_views_stack_per_view_and_the_step_reads_their_list():
    batch = collate(items(3, views=3), ImageForm(views=3))
    ref = default_collate(items(3, views=3))
    assert batch.multi and isinstance(batch.images, list) and len(batch.images) == 3
    assert all(torch.equal(a, b) for a, b in zip(batch.views, ref[0]))
    with pytest.raises(ValueError, match="3 image views"):  # a one-view item is not read as three channels
        collate(items(3), ImageForm(views=3))


def test_stored_files_stay_bytes_until_the_loader_decodes_them():
    raw = [(b"jpeg%d" % i, torch.arange(4), i) for i in range(2)]
    batch = collate(raw, image_form(EncodedImage()))
    assert batch.stored == (b"jpeg0", b"jpeg1") and batch.views == ()
    decoded = batch.with_views([torch.zeros(2, 3, 8, 8)])
    assert decoded.stored == () and decoded.images.shape == (2, 3, 8, 8)


def test_on_device_normalises_uint8_views_and_passes_float_ones():
    batch = collate(items(2, views=2), ImageForm(views=2))
    batch = batch.with_views([batch.views[0], batch.views[1].float()])
    on = batch.on_device(torch.device("cpu"))
    assert on.views[0].dtype == torch.float32 and not torch.equal(on.views[0], batch.views[0].float())
    assert torch.equal(on.views[1], batch.views[1].float())  # float: already normalised, unchanged
    assert on.positions is batch.positions  # positions stay on the host


def test_the_dataloaders_pinning_keeps_the_batch_type(monkeypatch):
    """On CUDA the DataLoader pins each batch (torch's pin_memory walk): it calls Batch.pin_memory, which pins
    every tensor field and gives a Batch back (here the pinning itself is a marker: no CUDA on the CPU runners)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(self.shape) or self.clone())
    batch = collate(items(2, views=2), ImageForm(views=2))
    out = pin_memory(batch)
    assert isinstance(out, Batch) and out.multi and len(out.views) == 2 and len(pinned) == 4  # 2 views, tokens, pos
    assert all(torch.equal(a, b) for a, b in zip(out.views, batch.views))
