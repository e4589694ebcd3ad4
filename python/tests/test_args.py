"""Strict arguments (issue 28, item 3): nothing that crosses into the
library is wrapped, truncated or aliased on the way. Seeds are integers in
[0, 2**64 - 1]; candidate keys are exactly a stage's name or its dataset
path; a NUL in a path, case, key or option is refused; the plugin's shared
goldens survive a test that closes them; generate() refuses a case that
does not fit in memory before allocating."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest

import dropless
from conftest import SRC, perturbed, plugin_args, stage_values


@pytest.mark.parametrize("seed", [2 ** 64 + 7, 2 ** 64, -1, 1.9, 1.0, True, "5", None.__class__])
def test_bad_seeds_refused(seed):
    with pytest.raises(ValueError, match="seed"):
        dropless.generate("tiny", seed=seed)


@pytest.mark.parametrize("seed", [0, 7, 2 ** 64 - 1, np.uint64(2 ** 64 - 1), np.int32(3)])
def test_seeds_in_range_kept_exactly(seed):
    with dropless.generate("tiny", seed=seed, backward=False) as g:
        assert g.seed == int(seed)


def test_seed_extremes_differ():
    # 2**64 - 1 is not wrapped to anything: its inputs are its own
    with dropless.generate("tiny", seed=2 ** 64 - 1, backward=False) as a, \
            dropless.generate("tiny", seed=0, backward=False) as b:
        assert not np.array_equal(a.inputs.fp32["x"], b.inputs.fp32["x"])


def _good_bad(g):
    good = g.forward["out"]
    return good, perturbed(good)


@pytest.mark.parametrize("order", [0, 1])
def test_alias_keys_are_an_error_naming_both(goldens, order):
    g = goldens("tiny")
    good, bad = _good_bad(g)
    items = [("out", good), ("forward/out", bad)]
    if order:
        items.reverse()
    with pytest.raises(dropless.Error) as e:
        dropless.check(g, dict(items))
    assert "'out'" in str(e.value) and "'forward/out'" in str(e.value)


@pytest.mark.parametrize("key", ["backward/out", "out\x00zzz", "/out", "forward//out", "Out",
                                 "inputs/x", "x", 3])
def test_inexact_keys_refused(goldens, key):
    g = goldens("tiny")
    with pytest.raises(dropless.Error) as e:
        dropless.check(g, {key: g.forward["out"]})
    assert repr(key) in str(e.value)


def test_dataset_paths_still_name_their_stage(goldens):
    g = goldens("tiny")
    r = dropless.check(g, {"/forward/out": g.forward["out"], "backward/d_x": g.backward["d_x"]})
    assert r.conformant
    # and a wrong value under a path is judged, not dropped
    r = dropless.check(g, {"forward/out": perturbed(g.forward["out"])})
    assert not r.conformant


@pytest.mark.parametrize("call", [
    lambda g, t: dropless.load(os.path.join(SRC, "vectors", "tiny.h5") + "\x00junk"),
    lambda g, t: dropless.generate("tiny\x00junk"),
    lambda g, t: g.save(str(t / "a.h5") + "\x00b"),
    lambda g, t: dropless.write_candidate(str(t / "c.h5") + "\x00b", stage_values(g), g),
    lambda g, t: dropless.check(g, str(t / "c.h5") + "\x00b"),
    lambda g, t: dropless.check(g, stage_values(g), backend="py\x00thon"),
    lambda g, t: dropless.check(g, stage_values(g), profile="fp32\x00"),
    lambda g, t: g.array("x\x00y"),
])
def test_nul_refused(goldens, tmp_path, call):
    with pytest.raises(ValueError, match="NUL"):
        call(goldens("tiny"), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written under a truncated name


def test_load_timeout_must_be_seconds():
    for t in (-1, "5", float("nan"), True):
        with pytest.raises(ValueError, match="timeout"):
            dropless.load(os.path.join(SRC, "vectors", "tiny.h5"), timeout=t)


def test_shared_golden_survives_close(pytester):
    # one test closes the session's golden (with/close): the next still has it
    pytester.makepyfile(test_k="""
        def test_closes(dropless_golden):
            with dropless_golden as g:
                assert g.inputs["x"].shape[0] == g.config["tokens"]
            dropless_golden.close()

        def test_after(dropless_golden):
            assert dropless_golden.forward["out"].size
    """)
    r = pytester.runpytest_inprocess(*plugin_args(), "--dropless-cases=tiny,tiny-bf16",
                                     "-p", "no:cacheprovider")
    r.assert_outcomes(passed=4)


def test_generate_refuses_what_does_not_fit():
    # in a child limited to 8 GiB of address space: deepseek-v3-layer needs
    # about 90 GiB in memory, refused before anything is allocated
    code = ("import resource, dropless\n"
            "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
            "need, avail = dropless.memory('deepseek-v3-layer')\n"
            "assert need > 80 << 30 and 0 < avail <= 8 << 30, (need, avail)\n"
            "try:\n"
            "    dropless.generate('deepseek-v3-layer')\n"
            "except dropless.Error as e:\n"
            "    assert e.name == 'DL_ENOMEM' and 'MiB' in str(e) and 'deepseek-v3-layer' in str(e), e\n"
            "    print('refused')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "refused", p.stderr


def test_progress_callback():
    calls = []
    with dropless.generate("mixtral-small", progress=lambda ph, d: calls.append((ph, d))):
        pass
    done = [d for _, d in calls]
    assert done == sorted(done) and done[0] == 0.0 and done[-1] == 1.0 and len(calls) >= 3
    buf = io.StringIO()
    with dropless.generate("tiny", progress=dropless.progress_bar(buf)):
        pass
    assert buf.getvalue().endswith("100% done      \n")
    with pytest.raises(TypeError):
        dropless.generate("tiny", progress=3)
