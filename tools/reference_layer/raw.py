"""Raw outputs of a machine without libdropless, and their conversion into
candidate files where the library is:

    python3 -m tools.reference_layer.raw RAW_DIR GOLDEN_DIR OUT_DIR

A raw file (CASE--BACKEND--MODE.npz) holds one array per stage and a JSON
record (case, backend, mode, compute_mode, notes, backend_version, device);
the conversion loads GOLDEN_DIR/CASE.h5 and writes the candidate through
tools/adapters/common.emit, as if it had been written on the device.
"""

import glob
import json
import os
import sys

import numpy as np

META = "__meta__"


def raw_name(case, backend, mode):
    s = "%s--%s--%s" % (case, backend, mode)
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s) + ".npz"


def save_raw(outdir, case, backend, mode, outputs, notes, compute_mode, version, device):
    meta = {"case": case, "backend": backend, "mode": mode, "compute_mode": compute_mode,
            "notes": notes, "backend_version": version, "device": device}
    path = os.path.join(outdir, raw_name(case, backend, mode))
    arrays = {n: np.asarray(v) for n, v in outputs.items()}
    arrays[META] = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


def load_raw(path):
    with np.load(path) as z:
        meta = json.loads(bytes(z[META]).decode())
        outputs = {n: z[n] for n in z.files if n != META}
    return meta, outputs


def convert(raw_dir, golden_dir, out_dir, log=print):
    """Every raw file of raw_dir as a candidate in out_dir: [(path, summary)]."""
    import dropless
    from tools.adapters import common
    os.makedirs(out_dir, exist_ok=True)
    done = []
    for p in sorted(glob.glob(os.path.join(raw_dir, "*.npz"))):
        meta, outputs = load_raw(p)
        with dropless.load(os.path.join(golden_dir, meta["case"] + ".h5")) as g:
            res = common.Result(meta["backend"], outputs, meta["notes"], meta["compute_mode"])
            done.append(common.emit(g, out_dir, res, meta["mode"], meta["backend_version"],
                                    meta["device"], meta["notes"].get("seconds", 0.0), log))
    return done


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python3 -m tools.reference_layer.raw RAW_DIR GOLDEN_DIR OUT_DIR", file=sys.stderr)
        return 2
    done = convert(*argv)
    print("%d candidate files in %s" % (len(done), argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
