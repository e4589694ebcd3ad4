"""Interleaved gate/up storage (doc/format.md, "Interleaved gate/up"): a
candidate may hand over h_gate_up, d_h_gate_up and d_w_gate_up [.., 2f]
with gate in the even columns (gpt-oss's gate_up_proj), as arrays to
check/write_candidate and as datasets of a candidate file; the halves
exchanged fail, a pair given twice or with an odd last extent is refused."""
import h5py
import numpy as np
import pytest

import dropless


def interleave(a, b):
    return np.stack([a, b], -1).reshape(a.shape[:-1] + (2 * a.shape[-1],))


def outputs(g, swap=False):
    fw, bw = g.forward, g.backward
    out = {k: v for k, v in list(fw.items()) + list(bw.items())
           if k in g.stages() and k not in ("h_gate", "h_up", "d_h_gate", "d_h_up", "d_w_gate", "d_w_up")}
    dwg, dwu = (bw["d_w_up"], bw["d_w_gate"]) if swap else (bw["d_w_gate"], bw["d_w_up"])
    out.update(h_gate_up=interleave(fw["h_gate"], fw["h_up"]),
               d_h_gate_up=interleave(bw["d_h_gate"], bw["d_h_up"]),
               d_w_gate_up=interleave(dwg, dwu))
    return out


def verdicts(rep):
    return {r.stage: r.verdict for r in rep.checks if r.check == "numerics"}


def test_interleaved_pairs_conform_and_are_checked(goldens):
    g = goldens("gpt-oss-full")
    rep = dropless.check(g, outputs(g))
    v = verdicts(rep)
    assert rep.conformant
    assert all(v[s] == "PASS" for s in ("h_gate", "h_up", "d_h_gate", "d_h_up", "d_w_gate", "d_w_up"))


def test_halves_exchanged_fail(goldens):
    g = goldens("gpt-oss-full")
    v = verdicts(dropless.check(g, outputs(g, swap=True)))
    assert v["d_w_gate"] == "FAIL" and v["d_w_up"] == "FAIL" and v["h_gate"] == "PASS"


def test_torch_like_strided_halves(goldens):
    torch = pytest.importorskip("torch")
    g = goldens("gpt-oss-full-bf16")
    out = outputs(g)
    out["d_w_gate_up"] = torch.from_numpy(out["d_w_gate_up"].astype(np.float32)).to(torch.bfloat16)
    assert dropless.check(g, out, profile="bf16-acc").conformant


def test_given_twice_or_odd_refused(goldens):
    g = goldens("gpt-oss-full")
    out = outputs(g)
    out["d_w_gate"] = g.backward["d_w_gate"]
    with pytest.raises(dropless.Error, match="d_w_gate"):
        dropless.check(g, out)
    out = outputs(g)
    out["d_w_gate_up"] = out["d_w_gate_up"][..., :-1]
    with pytest.raises(dropless.Error, match="even last extent"):
        dropless.check(g, out)


def test_written_candidate_stores_the_pair_apart(goldens, tmp_path):
    g = goldens("gpt-oss-full")
    p = dropless.write_candidate(str(tmp_path / "c.h5"), outputs(g), g)
    with h5py.File(p) as f:
        assert "d_w_gate" in f["backward"] and "d_w_gate_up" not in f["backward"]
        assert np.array_equal(f["backward/d_w_up"][...], g.backward["d_w_up"])
    assert dropless.check(g, p).conformant
