"""The package and `dropless check` give the same report for the same
candidate file, and write_candidate writes what the CLI reads."""
import json
import re
import subprocess

import numpy as np
import pytest

import dropless
from conftest import perturbed, stage_values


def _json(text):
    d = json.loads(text)
    d = d[0] if isinstance(d, list) else d
    d.pop("seconds")
    return d


def _table(text):
    return re.sub(r"\(\d+\.\d+ s\)", "(s)", text)


def cli_check(cli, gpath, cpath, tmp_path, *args):
    rj = tmp_path / ("r%d.json" % len(list(tmp_path.iterdir())))
    p = subprocess.run([cli, "check", "--json", str(rj), *args, str(gpath), str(cpath)],
                       capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, p.stdout, rj.read_text()


@pytest.mark.parametrize("case,isolated,broken", [
    ("mixtral-small", None, None),
    ("deepseek-v3-small-bf16", None, "d_w_gate"),
    ("plain-ffn-fp16", True, "y_sorted"),
    ("mixtral-small", [["h_gate", "h_up"], ["h_act"], ["y_sorted"], ["d_h_act", "d_w_down"]], "h_act"),
])
def test_same_report(tmp_path, goldens, cli, case, isolated, broken):
    g = goldens(case)
    names = None
    if isolated is True:
        names = ["y_sorted", "d_x_sorted", "d_w_down"]
    elif isolated:
        names = [n for grp in isolated for n in grp]
    outs = stage_values(g, names)
    if broken:
        outs[broken] = perturbed(outs[broken], by=2.0)
    gpath, cpath = tmp_path / "g.h5", tmp_path / "c.h5"
    g.save(gpath)
    dropless.write_candidate(cpath, outs, g, backend="mine", compute_mode="fp32", isolated=isolated,
                             backend_version="v9", device="a test")
    rc, table, js = cli_check(cli, gpath, cpath, tmp_path)
    from_file = dropless.check(dropless.load(gpath), cpath)
    in_memory = dropless.check(g, outs, backend="mine", compute_mode="fp32", isolated=isolated,
                               backend_version="v9")
    assert in_memory.data["backend_version"] == "v9"
    assert rc == (0 if from_file.conformant else 1) and from_file.conformant == (broken is None)
    assert _json(from_file.to_json()) == _json(js) == _json(in_memory.to_json())
    assert _table(str(from_file)) == _table(table) == _table(str(in_memory))
    rc2, table2, js2 = cli_check(cli, gpath, cpath, tmp_path, "--profile", "tf32")
    assert _json(dropless.check(g, cpath, profile="tf32").to_json()) == _json(js2)


def test_write_candidate_rules(tmp_path, goldens):
    g = goldens("mixtral-small-bf16")
    p = tmp_path / "c.h5"
    dropless.write_candidate(p, {"out": g.forward["out"]}, g)
    with pytest.raises(dropless.Error) as e:
        dropless.write_candidate(p, {"out": g.forward["out"]}, g)
    assert e.value.name == "DL_EEXIST"
    dropless.write_candidate(p, {"out": g.forward["out"]}, g, force=True)
    q = tmp_path / "off.h5"
    with pytest.raises(dropless.Error) as e:  # off the bf16 grid: the file cannot hold it
        dropless.write_candidate(q, {"h_gate": g.forward["h_gate"] * np.float32(1 + 2 ** -12)}, g)
    assert e.value.name == "DL_EGRID" and "h_gate" in str(e.value)
    with pytest.raises(dropless.Error):
        dropless.write_candidate(q, {"out": g.forward["out"]}, g, isolated=[["out", "d_x"]])
    assert not q.exists()
    h5py = pytest.importorskip("h5py", reason="h5py is not installed")
    with h5py.File(p) as f:
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        assert text(f.attrs["backend"]) == "python"
        assert text(f["forward/out"].attrs["dtype"]) == "bf16"
        assert f["forward/out"].dtype == np.dtype("<f4")


def test_candidate_file_errors(tmp_path, goldens):
    g = goldens("tiny")
    with pytest.raises(dropless.Error) as e:
        dropless.check(g, tmp_path / "missing.h5")
    assert e.value.name == "DL_EIO"
    other = tmp_path / "other.h5"
    dropless.write_candidate(other, {"out": goldens("mixtral-small").forward["out"]},
                             goldens("mixtral-small"))
    with pytest.raises(dropless.Error) as e:  # made for another case
        dropless.check(g, other)
    assert e.value.name in ("DL_ESHAPE", "DL_EDTYPE") and "other.h5" in str(e.value)
