#!/usr/bin/python3
"""Writes the fuzz seed corpus: small, unsealed candidate files for the
catalogue case "tiny" (the harness's configuration), from vectors/tiny.h5.
Unsealed on purpose: a sealed seed would stop every mutation at the seal.
Usage: tests/fuzz/make_seeds.py [vectors/tiny.h5] [tests/fuzz/corpus]"""
import os
import sys

import h5py
import numpy as np

src = sys.argv[1] if len(sys.argv) > 1 else "vectors/tiny.h5"
out = sys.argv[2] if len(sys.argv) > 2 else "tests/fuzz/corpus"
os.makedirs(out, exist_ok=True)
gold = h5py.File(src, "r")


def write(name, datasets, attrs=None, config=False, **kw):
    with h5py.File(os.path.join(out, "seed-" + name + ".h5"), "w", libver="earliest") as f:
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
        if config:
            g = f.create_group("config")
            for k, v in gold["config"].attrs.items():
                g.attrs[k] = v
        for path, (data, dtype_attr) in datasets.items():
            d = f.create_dataset(path, data=data, **kw)
            if dtype_attr is not None:
                d.attrs["dtype"] = dtype_attr


def ds(path, cast=None, dtype_attr=None):
    a = gold[path][()]
    return path, (a.astype(cast) if cast else a, dtype_attr)


# the routing stages the way a PyTorch adapter writes them: int64, no dtype
write("routing", dict([ds("forward/topk_ids", np.int64), ds("forward/topk_weights"),
                       ds("forward/sort_perm", np.int64), ds("forward/group_sizes")]),
      attrs={"backend": "fuzz-seed 1.0", "compute_mode": "fp32"})
# the whole forward pass with dtype attributes and a /config
write("forward", dict(ds("forward/" + n, None, "fp32") for n in gold["forward"]
                      if gold["forward/" + n].dtype == np.float32),
      attrs={"backend": "fuzz-seed", "backend_version": "2.0", "device": "cpu"}, config=True)
# the backward pass, chunked and compressed (HDF5's filter pipeline)
write("backward-gzip", dict(ds("backward/" + n) for n in ("d_x", "d_topk_weights", "d_w_down")),
      chunks=True, compression="gzip")
# integers of other widths, a dropped assignment
perm = gold["forward/sort_perm"][()].astype(np.int16)
perm[0] = -1
write("int-widths", {"forward/sort_perm": (perm, None),
                     "forward/inv_perm": (gold["forward/inv_perm"][()].astype(np.uint8), None),
                     "forward/group_offsets": (gold["forward/group_offsets"][()].astype(np.int32), None)})
# nothing but root attributes
write("empty", {}, attrs={"backend": "nothing"})
