"""Golden files without torch: through the package `dropless` (the C
library) where it loads, else with h5py alone (python/dropless/gpu/adapters/h5io.py: a
GPU machine without the library)."""

from ..adapters import h5io


def have_dropless():
    return h5io.library_error() is None


def open_golden(path):
    """A golden file (a context manager): dropless.load, else h5io.Golden."""
    return h5io.load(path)[0]
