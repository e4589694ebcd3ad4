"""Candidates with interleaved gate/up storage for tests/test_gate_up.sh.

usage: candidate.py GOLDEN CANDIDATE MODE

Writes CANDIDATE, a copy of GOLDEN whose h_gate/h_up, d_h_gate/d_h_up and
d_w_gate/d_w_up pairs are each one dataset NAME_gate_up [.., 2f], gate in
the even columns and up in the odd (gpt-oss's gate_up_proj), as MODE says:
  interleaved  the pairs interleaved, the separate datasets removed (correct)
  swapped      d_w_gate_up with up in the even columns (defective: the
               weight gradients' halves exchanged)
  twice        interleaved, the separate datasets kept (ambiguous: set aside)
  concat       [gate | up] concatenated, Mixtral's layout under the
               interleaved name (defective)
  odd          d_w_gate_up one column short ([E, d, 2f - 1]: set aside)
"""
import shutil
import sys

import h5py
import numpy as np

PAIRS = (("forward", "h_gate_up", "h_gate", "h_up"),
         ("backward", "d_h_gate_up", "d_h_gate", "d_h_up"),
         ("backward", "d_w_gate_up", "d_w_gate", "d_w_up"))


def main():
    src, dst, mode = sys.argv[1:4]
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        for grp, name, gate, up in PAIRS:
            a, b = f[grp][gate][...], f[grp][up][...]
            if mode == "swapped" and name == "d_w_gate_up":
                a, b = b, a
            if mode == "concat":
                il = np.concatenate([a, b], -1)
            else:
                il = np.stack([a, b], -1).reshape(a.shape[:-1] + (2 * a.shape[-1],))
            if mode == "odd" and name == "d_w_gate_up":
                il = il[..., :-1]
            if mode != "twice":
                del f[grp][gate], f[grp][up]
            f[grp].create_dataset(name, data=il)


if __name__ == "__main__":
    main()
