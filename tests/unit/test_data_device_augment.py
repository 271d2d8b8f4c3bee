"""The photometric augmentation on the device (protoclip.data.loading.device_augment): each batched step equals
torchvision's own function applied image by image with that image's factor; a batch replays as torchvision applies
its draws in the kind's order; the draws are a function of the key; the probabilities are the kind's; the workers'
side keeps only the crop and the flip."""
from __future__ import annotations

import pytest
import torch
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F

from protoclip.data.loading.device_augment import (DeviceAugment, adjust_brightness, adjust_contrast, adjust_hue,
                                           adjust_saturation, gaussian_blur, key_seed)
from protoclip.data.loading.transforms import (BLUR_P, GRAY_P, JITTER, JITTER_P, blur_params, normalize_batch,
                                       train_transform)


def images(n: int, size: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_each_adjustment_equals_torchvisions_per_image():
    x = images(5).float() / 255
    f = torch.tensor([0.2, 0.7, 1.0, 1.3, 1.8])
    h = torch.tensor([-0.2, -0.05, 0.0, 0.1, 0.2])
    for ours, theirs, fac in ((adjust_brightness, F.adjust_brightness, f), (adjust_contrast, F.adjust_contrast, f),
                              (adjust_saturation, F.adjust_saturation, f), (adjust_hue, F.adjust_hue, h)):
        arg = fac if ours is adjust_hue else fac.view(-1, 1, 1, 1)
        got = ours(x, arg)
        want = torch.stack([theirs(x[i], float(fac[i])) for i in range(len(x))])
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0, msg=ours.__name__)


def test_blur_equals_torchvisions_gaussian_blur_per_image():
    x = images(4, size=20).float() / 255
    sigma = torch.tensor([0.1, 0.6, 1.3, 2.0])
    got = gaussian_blur(x, 7, sigma)
    want = torch.stack([F.gaussian_blur(x[i], [7, 7], [float(s), float(s)]) for i, s in enumerate(sigma)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def replay(kind: str, image_size: int, batch: torch.Tensor, key: tuple[int, ...]) -> tuple[torch.Tensor, dict]:
    """What DeviceAugment must give, image by image with torchvision's functions, from the documented draws:
    columns 0 jitter applied (< p), 1-4 the factors, 5-8 the order (argsort), 9 grey (< p), 10 blur (< p), 11 sigma."""
    u = torch.rand((len(batch), 12), generator=torch.Generator().manual_seed(key_seed(key)))
    bri, con, sat, hue = JITTER[kind]
    lo = torch.tensor([max(0.0, 1 - bri), max(0.0, 1 - con), max(0.0, 1 - sat), -hue])
    hi = torch.tensor([1 + bri, 1 + con, 1 + sat, hue])
    fns = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    order = ("gray", "jitter") if kind == "mocov1" else ("jitter", "gray", "blur")
    kernel, (smin, smax) = blur_params(image_size, kind) if "blur" in order else (0, (0.0, 0.0))
    seen = {"jitter": 0, "gray": 0, "blur": 0}
    out = []
    for i, img in enumerate(batch.float() / 255):
        for step in order:
            if step == "jitter" and u[i, 0] < JITTER_P[kind]:
                factors = lo + (hi - lo) * u[i, 1:5]
                for op in torch.argsort(u[i, 5:9]).tolist():
                    img = fns[op](img, float(factors[op]))
                seen["jitter"] += 1
            elif step == "gray" and u[i, 9] < GRAY_P:
                img = F.rgb_to_grayscale(img, num_output_channels=3)
                seen["gray"] += 1
            elif step == "blur" and u[i, 10] < BLUR_P[kind]:
                s = float(smin + (smax - smin) * u[i, 11])
                img = F.gaussian_blur(img, [kernel, kernel], [s, s])
                seen["blur"] += 1
        out.append(img)
    return normalize_batch((torch.stack(out) * 255).round().to(torch.uint8)), seen


@pytest.mark.parametrize("kind", ["protoclip", "simclr", "mocov1"])
def test_a_batch_replays_as_torchvision_applies_its_draws(kind):
    batch, key = images(48, size=24), (3, 1, 0, 16, 0)
    got = DeviceAugment(kind, 64)(batch, key)
    want, seen = replay(kind, 64, batch, key)
    assert all(seen[s] > 0 for s in (("gray", "jitter") if kind == "mocov1" else seen)), seen  # every branch ran
    # the replay rounds to uint8 to reuse normalize_batch: half a level, times 1 / std (< 4) after normalising
    torch.testing.assert_close(got, want, atol=0.5 / 255 * 4 + 1e-5, rtol=0)


def test_draws_are_a_function_of_the_key_and_untouched_images_are_normalize_batchs():
    aug, batch = DeviceAugment("protoclip", 64), images(32)
    a, b, c = aug(batch, (0, 1, 0, 0, 0)), aug(batch, (0, 1, 0, 0, 0)), aug(batch, (0, 2, 0, 0, 0))
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain = normalize_batch(batch)
    same = [torch.equal(a[i], plain[i]) for i in range(len(batch))]
    assert any(same) and not all(same)  # (0.8^3 of the images draw no step)
    assert torch.equal(DeviceAugment("none", 64)(batch, (0,)), plain)  # crop-only kinds: normalising only
    floats = plain.clone()
    assert DeviceAugment("protoclip", 64)(floats, (0,)) is floats  # an evaluation view passes unchanged


def test_grey_probability_is_the_kinds():
    """ProtoCLIP's greyscale runs after the jitter (which never makes an image exactly grey) and before the blur
    (which keeps it grey): the grey fraction of 2000 colour images estimates GRAY_P (0.2; 4 standard errors)."""
    n = 2000
    batch = images(n, size=8, seed=1)
    out = DeviceAugment("protoclip", 64)(batch, (1, 2, 3))
    mean = torch.tensor((0.48145466, 0.4578275, 0.40821073)).view(1, 3, 1, 1)
    std = torch.tensor((0.26862954, 0.26130258, 0.27577711)).view(1, 3, 1, 1)
    unit = out * std + mean
    grey = ((unit[:, 0] - unit[:, 1]).abs().amax(dim=(1, 2)) < 1e-4) & ((unit[:, 1] - unit[:, 2]).abs().amax(
        dim=(1, 2)) < 1e-4)
    se = (GRAY_P * (1 - GRAY_P) / n) ** 0.5
    assert abs(grey.float().mean().item() - GRAY_P) < 4 * se


def test_the_workers_keep_only_the_crop_and_the_flip():
    kinds = {"protoclip": [T.RandomResizedCrop, T.RandomHorizontalFlip, T.PILToTensor],
             "mocov2": [T.RandomResizedCrop, T.RandomHorizontalFlip, T.PILToTensor],
             "none": [T.RandomResizedCrop, T.PILToTensor]}
    for kind, want in kinds.items():
        steps = train_transform(64, kind, "device").transforms
        assert [type(s) for s in steps[1:]] == want, kind
        assert steps[1].scale == train_transform(64, kind).transforms[1].scale
    with pytest.raises(ValueError, match="photometric"):
        train_transform(64, "protoclip", "gpu")
    with pytest.raises(ValueError, match="unknown augmentation"):
        DeviceAugment("simclr2", 64)


def jpegs(n: int, seed: int = 0) -> tuple[list[bytes], list]:
    """n smooth colour pictures of assorted sizes as JPEG files (quality 95) and as Pillow decodes them."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    blobs, pils = [], []
    for _ in range(n):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        yy, xx = np.mgrid[0:h, 0:w]
        arr = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (w + h) + rng.integers(0, 128)], -1)
        buf = io.BytesIO()
        Image.fromarray(arr.astype(np.uint8)).save(buf, format="JPEG", quality=95)
        blobs.append(buf.getvalue())
        pils.append(Image.open(io.BytesIO(blobs[-1])).convert("RGB"))
    return blobs, pils


def test_crop_params_are_torchvisions_draws_from_a_generator():
    from protoclip.data.loading.device_augment import crop_params

    for seed in range(40):
        for h, w, scale in ((300, 400, (0.5, 1.0)), (64, 48, (0.08, 1.0)), (20, 400, (0.9, 1.0))):  # last: fallback
            torch.manual_seed(seed)
            want = T.RandomResizedCrop.get_params(torch.zeros(3, h, w), list(scale), [3 / 4, 4 / 3])
            assert crop_params(h, w, scale, torch.Generator().manual_seed(seed)) == want


def test_device_decode_gives_pillows_pixels_and_decodes_other_formats_on_the_host():
    import io

    import numpy as np

    from protoclip.data.loading.device_augment import decode_images

    blobs, pils = jpegs(6)
    buf = io.BytesIO()
    pils[0].save(buf, format="PNG")
    out = decode_images(blobs + [buf.getvalue()], torch.device("cpu"))
    for img, pil in zip(out, pils + [pils[0]]):
        assert img.dtype == torch.uint8 and torch.equal(img, torch.from_numpy(np.asarray(pil)).permute(2, 0, 1))


def test_decode_crop_is_the_workers_crop_and_flip_with_the_keys_draws():
    """The workers' crop + flip (train_transform(..., "device"): PIL) drawing from the global generator seeded as
    decode_crop seeds its own draws the same crops and flips: the two differ only by the resize (torchvision's
    antialiased bicubic on tensors vs Pillow's), a level or two on smooth pictures."""
    from protoclip.data.loading.device_augment import key_seed

    blobs, pils = jpegs(12, seed=1)
    aug, key = DeviceAugment("protoclip", 32), (0, 3, 1, 8, 0)
    got = aug.decode_crop(blobs, key, torch.device("cpu"))
    torch.manual_seed(key_seed((*key, 1)))
    worker = train_transform(32, "protoclip", "device")
    want = torch.stack([worker(p) for p in pils])
    assert got.shape == want.shape == (12, 3, 32, 32) and got.dtype == torch.uint8
    diff = (got.float() - want.float()).abs()
    assert diff.mean() < 1.5 and diff.amax() <= 12
    flipped = torch.stack([worker(p) for p in pils])  # other draws: other crops, so the comparison can tell
    assert (got.float() - flipped.float()).abs().mean() > 3 * diff.mean()
    assert torch.equal(got, aug.decode_crop(blobs, key, torch.device("cpu")))  # a function of the key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bench/gpu_suite.sh runs it on a GPU machine)")
def test_on_cuda_the_same_augmentation_and_decoding_as_on_the_cpu():
    """The host draws are the device's: on CUDA the colour steps give the CPU's values (float rounding apart), and
    nvJPEG + the crop give the CPU's decode + crop within a level or two (nvJPEG's IDCT is not libjpeg-turbo's)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    aug, batch, key = DeviceAugment("protoclip", 64), images(48, size=24), (5, 0, 1, 0, 0)
    torch.testing.assert_close(aug(batch.to(cuda), key).cpu(), aug(batch, key), atol=1e-4, rtol=0)
    blobs, _ = jpegs(16, seed=2)
    on_gpu = aug.decode_crop(blobs, key, cuda)
    assert on_gpu.device.type == "cuda"
    diff = (on_gpu.cpu().float() - aug.decode_crop(blobs, key, cpu).float()).abs()
    assert diff.mean() < 1.0 and diff.amax() <= 16
