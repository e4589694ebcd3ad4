"""Golden files without torch: through the package `dropless` (the C
library) where it loads, else with h5py alone (a machine without the
library reads what the layer needs: case, config, dims, arrays)."""


def have_dropless():
    try:
        import dropless
        dropless.library_path()
        return True
    except Exception:
        return False


class H5Golden:
    """The parts of dropless.Golden the layer reads (case, config, dims,
    array), from the file with h5py alone."""

    def __init__(self, path):
        import h5py
        self.path = path
        self._f = h5py.File(path, "r")
        dec = lambda v: v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)
        self.case = dec(self._f.attrs["case"])
        self.config = {k: dec(v) for k, v in self._f["config"].attrs.items()}
        c = self.config
        self.dims = {"T": c["tokens"], "d": c["hidden"], "f": c["ffn"], "E": c["experts"],
                     "k": c["top_k"], "M": c["tokens"] * c["top_k"]}

    def array(self, name):
        return self._ds(name)[()]

    def _ds(self, name):
        for grp in ("inputs", "forward", "backward"):
            if grp in self._f and name in self._f[grp]:
                return self._f[grp][name]
        raise KeyError(name)

    def shape(self, name):
        return tuple(self._ds(name).shape)

    def dtype_of(self, name):
        v = self._ds(name).attrs["dtype"]
        return v.decode() if isinstance(v, bytes) else str(v)

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_golden(path):
    if have_dropless():
        import dropless
        return dropless.load(path)
    return H5Golden(path)


