#!/usr/bin/python3
"""Writes mutants of the ONNX backend suite's small models for scripts/fuzz-extremes.sh: every
integer attribute, folded input value and declared dimension set in turn to the values where shape
arithmetic and casts go wrong (near +-2^63, +-2^31, -1, 0, NaN, infinities, empty axes).

libFuzzer's mutations reach such values rarely (a varint of 2^62 is nine exact bytes); this
enumerates them. Each family is a folder of OUT:

  attrs-big     int attributes (each ints element, then all) at +-2^62, 2^63 - 1, -2^63, 2^32 + 1
  attrs-small   int attributes at -1, 0, -2, +-2^31, 7, 1000003; float ones at NaN, +-inf, +-1e30, 0
  inputs-big    the test's inputs as initializers (so the compile folds the op on them), integer
                ones (all, first or last element) at the type's extremes, float ones at NaN, inf, -1e30
  inputs-small  as inputs-big, integer inputs at -1, 0, +-1000, +-2^31, 3
  inputs-empty  as inputs-big, one input emptied along one axis
  dims          the graph inputs' declared dimensions (one, then all) at 2^62, 2^40 + 1, 2^31 + 1,
                0, 2^63 - 1

Usage: tests/fuzz/extreme_mutants.py OUT [FAMILY...]"""
import glob
import hashlib
import math
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

SUITE = "/usr/share/libonnx-testdata/data"
A = onnx.AttributeProto
FAMILIES = ["attrs-big", "attrs-small", "inputs-big", "inputs-small", "inputs-empty", "dims"]


def cases():
    """(tag, folder) of each small test of the suite: node, pytorch-*, simple."""
    dirs = glob.glob(f"{SUITE}/node/*/") + glob.glob(f"{SUITE}/pytorch-*/*/") + glob.glob(f"{SUITE}/simple/*/")
    for d in sorted(dirs):
        if os.path.getsize(d + "model.onnx") <= 200_000:
            parts = d.rstrip("/").split("/")
            yield f"{parts[-2]}.{parts[-1]}", d


class Writer:
    def __init__(self, folder):
        self.folder, self.seen, self.count = folder, set(), 0
        os.makedirs(folder, exist_ok=True)

    def write(self, model, name):
        data = model.SerializeToString()
        digest = hashlib.sha1(data).hexdigest()
        if digest in self.seen:
            return
        self.seen.add(digest)
        self.count += 1
        with open(os.path.join(self.folder, f"{name}.onnx"), "wb") as f:
            f.write(data)


def copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def attributes(w, tag, model, ints, floats):
    for ni, node in enumerate(model.graph.node):
        for ai, attr in enumerate(node.attribute):
            if attr.type in (A.INT, A.INTS):
                values = ints
            elif attr.type in (A.FLOAT, A.FLOATS) and floats:
                values = floats
            else:
                continue
            listed = attr.type in (A.INTS, A.FLOATS)
            count = len(attr.ints) if attr.type == A.INTS else len(attr.floats)
            where = ["all"] + list(range(min(count, 4))) if listed else [None]
            for v in values:
                for k in where:
                    m = copy(model)
                    a = m.graph.node[ni].attribute[ai]
                    if attr.type == A.INT:
                        a.i = v
                    elif attr.type == A.FLOAT:
                        a.f = v
                    else:
                        items = a.ints if attr.type == A.INTS else a.floats
                        for j in range(len(items)):
                            if k == "all" or k == j:
                                items[j] = v
                    w.write(m, f"{tag}.node{ni}.{attr.name}.{k}.{v}")


def test_inputs(folder, model):
    """The inputs of test_data_set_0 as (name, array), or None if one is missing, a string or large."""
    arrays = []
    for i, info in enumerate(model.graph.input):
        path = f"{folder}test_data_set_0/input_{i}.pb"
        if not os.path.exists(path):
            return None
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        a = numpy_helper.to_array(t)
        if a.dtype == object or a.size > 100_000:
            return None
        arrays.append((info.name, a))
    return arrays or None


def folded(model, arrays):
    """The model with the arrays as initializers instead of graph inputs."""
    m = copy(model)
    names = {name for name, _ in arrays}
    keep = [i for i in m.graph.input if i.name not in names]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for name, a in arrays:
        m.graph.initializer.append(numpy_helper.from_array(a, name))
    return m


def input_values(w, tag, model, arrays, family):
    for k, (name, a) in enumerate(arrays):
        if family == "inputs-empty":
            for axis in range(a.ndim):
                if a.shape[axis]:
                    changed = list(arrays)
                    changed[k] = (name, np.take(a, [], axis=axis))
                    w.write(folded(model, changed), f"{tag}.in{k}.empty{axis}")
            continue
        if a.size == 0:
            continue
        if np.issubdtype(a.dtype, np.integer):
            info = np.iinfo(a.dtype)
            if family == "inputs-big":
                half = info.max // 2 + 1
                values = [info.max, info.min, half, -half if info.min < 0 else info.max // 3]
            else:
                values = [v for v in [-1, 0, 1000, -1000, 2**31 - 1, -(2**31), 3] if info.min <= v <= info.max]
        elif np.issubdtype(a.dtype, np.floating) and family == "inputs-big":
            values = [np.nan, np.inf, -6e4 if a.dtype == np.float16 else -1e30]
        else:
            continue
        for v in values:
            for where in ("all", "first", "last"):
                b = a.copy()
                flat = b.reshape(-1)
                if where == "all":
                    flat[:] = v
                elif where == "first":
                    flat[0] = v
                else:
                    flat[-1] = v
                changed = list(arrays)
                changed[k] = (name, b)
                w.write(folded(model, changed), f"{tag}.in{k}.{where}.{v}")


def dims(w, tag, model):
    for k, info in enumerate(model.graph.input):
        if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            continue
        rank = len(info.type.tensor_type.shape.dim)
        for v in [2**62, 2**40 + 1, 2**31 + 1, 0, 2**63 - 1]:
            for where in ["all"] + list(range(rank)):
                m = copy(model)
                for j, d in enumerate(m.graph.input[k].type.tensor_type.shape.dim):
                    if where == "all" or where == j:
                        d.ClearField("dim_param")
                        d.dim_value = v
                w.write(m, f"{tag}.in{k}.dim{where}.{v}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    families = sys.argv[2:] or FAMILIES
    for f in families:
        if f not in FAMILIES:
            sys.exit(f"unknown family '{f}'; the families are {', '.join(FAMILIES)}")
    writers = {f: Writer(os.path.join(out, f)) for f in families}
    big = [2**62, -(2**62), 2**63 - 1, -(2**63), 2**32 + 1]
    small = [-1, 0, -2, 2**31 - 1, -(2**31), 7, 1000003]
    special = [math.nan, math.inf, -math.inf, 1e30, -1e30, 0.0]
    for tag, folder in cases():
        try:
            model = onnx.load(folder + "model.onnx")
        except Exception:  # a file the onnx package cannot read is the model target's own seed
            continue
        if "attrs-big" in writers:
            attributes(writers["attrs-big"], tag, model, big, [])
        if "attrs-small" in writers:
            attributes(writers["attrs-small"], tag, model, small, special)
        if "dims" in writers:
            dims(writers["dims"], tag, model)
        if any(f.startswith("inputs-") for f in writers):
            try:
                arrays = test_inputs(folder, model)
            except Exception:
                arrays = None
            if arrays:
                for f in ("inputs-big", "inputs-small", "inputs-empty"):
                    if f in writers:
                        input_values(writers[f], tag, model, arrays, f)
    for f, w in writers.items():
        print(f"{f}: {w.count} models")


if __name__ == "__main__":
    main()
