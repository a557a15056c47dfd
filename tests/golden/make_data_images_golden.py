#!/usr/bin/env python3
"""Images and their PIL / torchvision pixels for tests/data/decode_test.cpp and
transforms_test.cpp.

Run by hand where python3 has numpy, pillow, scikit-image (the photographs), torch and
torchvision (pip install numpy pillow scikit-image torch torchvision); deterministic.
Writes:
- tests/golden/images/*.jpg: small rescaled crops of scikit-image's sample photographs,
  saved by PIL (libjpeg-turbo) at quality 90: 4:2:0, 4:2:2, 4:4:4, progressive,
  greyscale, CMYK (Adobe), and a larger 4:2:0 one with restart markers (region decoding);
- tests/golden/images/*.png: written by png_bytes() below (every colour type, bit depths
  1, 2, 4, 8, 16, a palette with tRNS, Adam7 interlacing);
- tests/golden/data_images.safetensors (U8 and F32 tensors):
  decode.<file>: [H, W, 3] (every file but jregion.jpg, kept out for size) what Image.open(file).convert("RGB") gives, except for the
    16-bit PNGs: round(v * 255 / 65535) of the written samples (PIL clips or keeps the
    high byte there); the script checks that PIL agrees on every other file;
  resize.<case>, center_crop.<case>, resized_crop.<case>, hflip: [C, H, W] uint8 outputs
    of torchvision.transforms.functional on the uint8 tensor of decode.j420.jpg (the
    tensor path: float passes, round half to even), with the case's parameters in its name;
  normalize: [3, H, W] f32, Normalize(mean, std)(ToTensor()(image)) of decode.j444.jpg.
"""
import json
import os
import struct
import zlib

import numpy as np
import skimage.data
import torch
import torchvision.transforms.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(HERE, "images")


def photo(name, size, box=None):
    img = Image.fromarray(getattr(skimage.data, name)())
    if box:
        img = img.crop(box)
    return img.resize(size, Image.LANCZOS)


def png_bytes(samples, color_type, bit_depth, palette=None, trns=None, interlace=False):
    """A PNG of `samples` ([H, W] or [H, W, C] integers < 2**bit_depth), written by hand so
    every colour type and depth can be made (PIL writes few of them)."""
    samples = np.asarray(samples)
    h, w = samples.shape[:2]
    samples = samples.reshape(h, w, -1)

    def pack(rows):  # rows [h', w', C] -> bytes with a filter byte (0) per row
        out = b""
        for row in rows:
            flat = row.reshape(-1)
            if bit_depth == 16:
                data = flat.astype(">u2").tobytes()
            elif bit_depth == 8:
                data = flat.astype(np.uint8).tobytes()
            else:
                bits = "".join(format(int(v), f"0{bit_depth}b") for v in flat)
                bits += "0" * (-len(bits) % 8)
                data = bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))
            out += b"\0" + data
        return out

    if interlace:  # Adam7: (x0, y0, dx, dy) per pass
        raw = b"".join(pack(samples[y0::dy, x0::dx]) for x0, y0, dx, dy in
                       [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                        (0, 1, 1, 2)] if samples[y0::dy, x0::dx].size)
    else:
        raw = pack(samples)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0,
                                                            1 if interlace else 0))
    if palette is not None:
        out += chunk(b"PLTE", bytes(np.asarray(palette, np.uint8).reshape(-1)))
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = {np.uint8: "U8", np.float32: "F32"}[a.dtype.type]
        blob = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    os.makedirs(IMAGES, exist_ok=True)
    golden = {}
    rng = np.random.default_rng(37)

    # ---- JPEGs, saved by PIL ----
    jpegs = {
        "j420.jpg": (photo("astronaut", (77, 61), (60, 20, 460, 340)), dict(subsampling=2)),
        "j422.jpg": (photo("chelsea", (70, 50)), dict(subsampling=1)),
        "j444.jpg": (photo("coffee", (60, 45)), dict(subsampling=0)),
        "jprogressive.jpg": (photo("astronaut", (66, 66)), dict(subsampling=2, progressive=True)),
        "jgrey.jpg": (photo("camera", (57, 43)), {}),
        "jcmyk.jpg": (photo("coffee", (48, 40)).convert("CMYK"), {}),
        "jregion.jpg": (photo("chelsea", (203, 141)), dict(subsampling=2, restart_marker_blocks=3)),
    }
    for name, (img, options) in jpegs.items():
        img.save(os.path.join(IMAGES, name), quality=90, **options)

    # ---- PNGs, written by hand ----
    rgb16 = rng.integers(0, 65536, (9, 11, 3))
    grey16 = rng.integers(0, 65536, (7, 10))
    palette = rng.integers(0, 256, (16, 3))
    base = np.asarray(photo("astronaut", (23, 17)))
    pngs = {
        "rgb8.png": png_bytes(base, 2, 8),
        "rgba8.png": png_bytes(np.dstack([base, rng.integers(0, 256, base.shape[:2])]), 6, 8),
        "grey8.png": png_bytes(base[..., 1], 0, 8),
        "greyalpha8.png": png_bytes(np.dstack([base[..., 0], rng.integers(0, 256, base.shape[:2])]), 4, 8),
        "grey1.png": png_bytes(rng.integers(0, 2, (13, 19)), 0, 1),
        "grey2.png": png_bytes(rng.integers(0, 4, (13, 19)), 0, 2),
        "grey4.png": png_bytes(rng.integers(0, 16, (13, 19)), 0, 4),
        "palette4_trns.png": png_bytes(rng.integers(0, 16, (12, 15)), 3, 4, palette=palette,
                                       trns=bytes(rng.integers(0, 256, 16, dtype=np.uint8))),
        "rgb16.png": png_bytes(rgb16, 2, 16),
        "grey16.png": png_bytes(grey16, 0, 16),
        "interlaced.png": png_bytes(base, 2, 8, interlace=True),
    }
    for name, data in pngs.items():
        with open(os.path.join(IMAGES, name), "wb") as f:
            f.write(data)

    # ---- what PIL decodes ----
    for name in [n for n in jpegs if n != "jregion.jpg"] + list(pngs):  # jregion: decode_test's own
        pil = np.asarray(Image.open(os.path.join(IMAGES, name)).convert("RGB"))
        golden[f"decode.{name}"] = pil
    for name, v in [("rgb16.png", rgb16), ("grey16.png", np.repeat(grey16[..., None], 3, 2))]:
        ours = np.floor(v * 255 / 65535 + 0.5).astype(np.uint8)  # never exactly halfway
        print(f"{name}: PIL differs from round(v * 255 / 65535) by up to",
              np.abs(golden[f"decode.{name}"].astype(int) - ours).max(), "levels")
        golden[f"decode.{name}"] = ours
    # The PNGs' intended pixels, independently of PIL: every sample as RGB, alpha dropped.
    expect = {"rgb8.png": base, "grey8.png": np.repeat(base[..., 1:2], 3, 2), "interlaced.png": base}
    for name, v in expect.items():
        assert (golden[f"decode.{name}"] == v).all(), name

    # ---- torchvision's tensor path on uint8 ----
    x = torch.from_numpy(golden["decode.j420.jpg"]).permute(2, 0, 1).contiguous()  # [3, 61, 77]
    bl, bc = InterpolationMode.BILINEAR, InterpolationMode.BICUBIC
    resize_cases = {"32_bilinear": (32, bl), "32_bicubic": (32, bc), "20x50_bilinear": ([20, 50], bl),
                    "20x50_bicubic": ([20, 50], bc), "70_bilinear": (70, bl), "70_bicubic": (70, bc),
                    "61x30_bicubic": ([61, 30], bc)}
    for name, (size, mode) in resize_cases.items():
        golden[f"resize.{name}"] = F.resize(x, size, interpolation=mode, antialias=True).numpy()
    for size in [(31, 31), (30, 40), (61, 77), (70, 80)]:
        golden["center_crop.%dx%d" % size] = F.center_crop(x, list(size)).numpy()
    for top, left, h, w, out in [(3, 5, 40, 50, 24), (0, 0, 61, 77, 32), (10, 7, 13, 9, 20)]:
        golden[f"resized_crop.{top}_{left}_{h}_{w}_{out}"] = F.resized_crop(
            x, top, left, h, w, [out, out], interpolation=bl, antialias=True).numpy()
    golden["hflip"] = F.hflip(x).numpy()
    y = F.to_tensor(Image.fromarray(golden["decode.j444.jpg"]))
    golden["normalize"] = F.normalize(y, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]).numpy().astype(np.float32)

    write_safetensors(os.path.join(HERE, "data_images.safetensors"), golden)
    total = sum(os.path.getsize(os.path.join(IMAGES, f)) for f in os.listdir(IMAGES))
    print(f"{len(golden)} tensors; images {total} bytes, goldens",
          os.path.getsize(os.path.join(HERE, "data_images.safetensors")), "bytes")


if __name__ == "__main__":
    main()
