"""Hostile files never run in-process: every file of the fuzz corpus
(tests/fuzz/corpus: HDF5 crashers, hangs, damaged metadata, seeds) goes
through dropless.load and dropless.check(golden, path) in a child Python,
so a crash or hang of the interpreter is seen here as the child's exit
status, not as the death of this pytest session. Each outcome must be the
CLI's for the same file (`dropless info` / `dropless check`): an Error
naming the file exactly where the CLI refuses it (exit 2), a verdict with
the CLI's conformance where the CLI gives one."""
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import SRC

CORPUS = sorted(glob.glob(os.path.join(SRC, "tests", "fuzz", "corpus", "*.h5")))
GOLDEN = os.path.join(SRC, "vectors", "tiny.h5")
LIMIT = 3  # seconds for the child's parse: the hang-* files must hit it

# Runs in the child: one JSON line per (file, entry point), flushed, so the
# parent knows which file a crash happened on.
CHILD = r"""
import json, sys, dropless
g = dropless.load(sys.argv[1])
for path in sys.argv[3:]:
    for what in ("load", "check"):
        print(json.dumps({"file": path, "what": what}), flush=True)
        try:
            if what == "load":
                dropless.load(path, timeout=int(sys.argv[2])).close()
                out = {"ok": True}
            else:
                r = dropless.check(g, path, timeout=int(sys.argv[2]))
                out = {"ok": True, "conformant": r.conformant,
                       "judged": sum(r.counts.get(v, 0) for v in ("PASS", "WARN", "FAIL"))}
        except dropless.Error as e:
            out = {"ok": False, "message": str(e), "name": e.name}
        print(json.dumps(dict(out, file=path, what=what)), flush=True)
"""


@pytest.fixture(scope="module")
def outcomes():
    assert len(CORPUS) >= 30, "tests/fuzz/corpus is missing"
    p = subprocess.run([sys.executable, "-c", CHILD, GOLDEN, str(LIMIT)] + CORPUS,
                       capture_output=True, text=True, timeout=60 + 4 * LIMIT * len(CORPUS))
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    done = [d for d in lines if "ok" in d]
    if p.returncode != 0:
        last = lines[-1] if lines else {}
        pytest.fail("the interpreter died (status %d) on %s through %s: %s"
                    % (p.returncode, last.get("file"), last.get("what"), p.stderr[-2000:]))
    return {(d["file"], d["what"]): d for d in done}


def test_every_file_has_an_outcome(outcomes):
    """Nothing crashed or hung: each file reached an outcome both ways."""
    missing = [(os.path.basename(f), w) for f in CORPUS for w in ("load", "check")
               if (f, w) not in outcomes]
    assert not missing


def test_errors_name_the_file(outcomes):
    bad = [d for d in outcomes.values() if not d["ok"] and d["file"] not in d["message"]]
    assert not bad
    # the crashers and hangs are among the refusals, as Errors
    for f in CORPUS:
        if os.path.basename(f).startswith(("crash-", "hang-golden")):
            assert not outcomes[(f, "load")]["ok"], f


def _cli_status(cli, *args):
    env = dict(os.environ, DROPLESS_PREFLIGHT_SECONDS=str(LIMIT))
    return subprocess.run([cli, *args], capture_output=True, env=env, timeout=60).returncode


@pytest.mark.parametrize("path", CORPUS, ids=[os.path.basename(f) for f in CORPUS])
def test_same_outcome_as_the_cli(outcomes, cli, path):
    d = outcomes[(path, "load")]
    assert _cli_status(cli, "info", path) == (0 if d["ok"] else 2), d
    d = outcomes[(path, "check")]
    want = 2 if not d["ok"] else (0 if d["conformant"] else 1)
    got = _cli_status(cli, "check", GOLDEN, path)
    if got == 2 and d["ok"] and not d["judged"]:
        # "nothing to check": the CLI's usage error, the package's
        # not-conformant report with nothing judged; never conformance
        assert not d["conformant"]
        return
    assert got == want, d
