"""Fixtures of the package's tests: small goldens made once per session,
the `dropless` command of the same build for parity tests."""
import os
import shutil

import numpy as np
import pytest

import dropless

pytest_plugins = ["pytester"]

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))


@pytest.fixture(scope="session")
def goldens():
    made = {}

    def get(name):
        if name not in made:
            made[name] = dropless.generate(name)
        return made[name]
    yield get
    for g in made.values():
        g.close()


@pytest.fixture(scope="session")
def cli():
    """The dropless command beside the library in use (DROPLESS_CLI, else
    the build tree's)."""
    path = os.environ.get("DROPLESS_CLI") or os.path.join(
        os.environ.get("top_builddir", SRC), "dropless")
    if not os.access(path, os.X_OK):
        path = shutil.which("dropless")
    if not path:
        pytest.skip("no dropless command (set DROPLESS_CLI)")
    return path


def stage_values(g, names=None):
    """The golden's own stage values (a candidate that must conform)."""
    out = {}
    for group in (g.forward, g.backward):
        for n in group:
            if n != "tie_margin" and (names is None or n in names):
                out[n] = group[n]
    return out


def perturbed(a, where=(0, 0), by=1.0):
    """a with one element moved far, to a value exact in every storage type
    (by * 1024, or by * 512 where the element held that already)."""
    a = np.array(a, copy=True)
    where = tuple(where) + (0,) * (a.ndim - len(where))
    v = np.float32(by * 1024)
    a[where] = v if a[where] != v else v / 2
    return a


def plugin_args():
    """The -p option pytester runs need for the plugin: none where the
    installed entry point loads it, else its module (a checkout)."""
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    return [] if any(e.name == "dropless" for e in eps) else ["-p", "dropless.pytest_plugin"]
