#!/usr/bin/python3
"""Writes the committed seed inputs of corpus/npy and corpus/idx (numpy's writer and the IDX
format by hand, so that the seeds do not come from the readers under test). The model and
tensorproto seeds are files of the ONNX backend suite; the checkpoint seed is written by
fuzz_checkpoint itself (docs/fuzzing.md)."""
import gzip
import os
import struct

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))


def npy_seeds(d):
    os.makedirs(d, exist_ok=True)
    np.save(f"{d}/f32_2x3.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(f"{d}/f64_scalar.npy", np.array(1.5))
    np.save(f"{d}/i64_4.npy", np.array([1, -2, 3, 4], dtype=np.int64))
    np.save(f"{d}/u8_2x2x2.npy", np.arange(8, dtype=np.uint8).reshape(2, 2, 2))
    np.save(f"{d}/bool_3.npy", np.array([True, False, True]))
    np.save(f"{d}/f16_empty.npy", np.zeros((0, 3), dtype=np.float16))
    with open(f"{d}/i32_v2.npy", "wb") as f:  # format 2.0: a 4-byte header length
        np.lib.format.write_array(f, np.arange(3, dtype=np.int32), version=(2, 0))


def idx_seeds(d):
    os.makedirs(d, exist_ok=True)

    def idx(name, code, arr, dtype, gz=False):
        arr = np.asarray(arr)
        b = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
        b += arr.astype(dtype).tobytes()
        with open(f"{d}/{name}", "wb") as f:
            f.write(gzip.compress(b, mtime=0) if gz else b)

    idx("u8_labels.idx", 0x08, [1, 2, 3, 9], "u1")
    idx("u8_images.idx", 0x08, np.arange(18).reshape(2, 3, 3), "u1")
    idx("u8_images.idx.gz", 0x08, np.arange(18).reshape(2, 3, 3), "u1", gz=True)
    idx("i8.idx", 0x09, [-1, 1], "i1")
    idx("i16.idx", 0x0B, [1, -2, 300], ">i2")
    idx("i32.idx", 0x0C, [7, -7], ">i4")
    idx("f32.idx", 0x0D, [[1.5, -2], [0, 3]], ">f4")
    idx("f64.idx", 0x0E, [1.25], ">f8")


npy_seeds(f"{here}/corpus/npy")
idx_seeds(f"{here}/corpus/idx")
