"""Finds libdropless and declares the functions of dropless/api.h that the
package calls. Nothing else of the C library is mirrored here: everything
crosses as handles, strings, flat arrays and scalars.

Where the library comes from, in order: the DROPLESS_LIB environment
variable (a path to libdropless.so); the package's own (dropless/_native/,
built or taken at install by python/setup.py); the installed library
(ctypes.util, then pkg-config's libdir for dropless); the build tree when
the package is imported from a checkout (python/dropless -> ../../.libs). The library is
loaded on first use, so `import dropless` and the pytest plugin never fail
for want of it.
"""

import ctypes
import ctypes.util
import os
import subprocess
import threading

API_VERSION = 1
_lock = threading.Lock()
_lib = None
ERRLEN = 1024


# The progress callback of dl_api_golden_generate_ex and dl_api_check_ex:
# (ctx, phase or stage, done in [0, 1])
PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_double)


class Progress:
    """A Python progress callable as the library's PROGRESS (.c; a NULL one
    for None). An exception the callable raises cannot cross the C frames:
    the first is kept, the callable is not called again, and reraise()
    raises it once the library call has returned."""

    def __init__(self, fn, what="progress(phase, done)"):
        if fn is not None and not callable(fn):
            raise TypeError("progress must be callable as " + what)
        self.fn = fn
        self.error = None
        self.c = PROGRESS(self._call) if fn is not None else PROGRESS(0)

    def _call(self, ctx, name, done):
        if self.error is not None:
            return
        try:
            self.fn(name.decode("utf-8", "replace"), done)
        except BaseException as e:  # KeyboardInterrupt too: raised after the call
            self.error = e

    def reraise(self):
        if self.error is not None:
            e, self.error = self.error, None
            raise e


class Error(Exception):
    """An error of the C library: .code is its negative DL_E* code, .name
    the symbolic name ("DL_ESHAPE"), str(e) its one-line message."""

    def __init__(self, message, code=None, name=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.name = name

    def __reduce__(self):
        return (Error, (self.message, self.code, self.name))


def _candidates():
    env = os.environ.get("DROPLESS_LIB")
    if env:
        return [("DROPLESS_LIB", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    packaged = os.path.join(here, "_native", "libdropless.so")
    if os.path.isfile(packaged):
        out.append(("package", packaged))
    found = ctypes.util.find_library("dropless")
    if found:
        out.append(("installed", found))
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "dropless"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        libdir = ""
    if libdir:
        out.append(("pkg-config", os.path.join(libdir, "libdropless.so")))
    out.append(("build tree", os.path.join(here, "..", "..", ".libs", "libdropless.so")))
    return out


def _declare(lib):
    c_int, c_char_p, c_void_p, c_size_t = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
    P = ctypes.POINTER
    sig = {
        "dl_api_version": (c_int, []),
        "dl_api_free_text": (None, [c_void_p]),
        "dl_api_cases_json": (c_void_p, []),
        "dl_api_layout_json": (c_void_p, []),
        "dl_api_golden_generate": (c_int, [c_char_p, c_int, ctypes.c_uint64, c_int, P(c_void_p),
                                           c_char_p, c_size_t]),
        "dl_api_golden_generate_ex": (c_int, [c_char_p, c_int, ctypes.c_uint64, c_int, c_int,
                                              PROGRESS, c_void_p, P(c_void_p), c_char_p, c_size_t]),
        "dl_api_golden_memory": (c_int, [c_char_p, c_int, P(ctypes.c_int64), P(ctypes.c_int64),
                                         c_char_p, c_size_t]),
        "dl_api_golden_open": (c_int, [c_char_p, ctypes.c_uint, P(c_void_p), c_char_p, c_size_t]),
        "dl_api_golden_save": (c_int, [c_void_p, c_char_p, c_int, c_char_p, c_size_t]),
        "dl_api_golden_free": (None, [c_void_p]),
        "dl_api_golden_info_json": (c_void_p, [c_void_p]),
        "dl_api_golden_array": (c_int, [c_void_p, c_char_p, P(c_void_p), P(c_int), P(c_int),
                                        P(ctypes.c_int64), c_char_p, c_size_t]),
        "dl_api_candidate_new": (c_int, [c_void_p, c_char_p, c_char_p, P(c_void_p), c_char_p,
                                         c_size_t]),
        "dl_api_candidate_set_attr": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_size_t]),
        "dl_api_candidate_set": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_int,
                                         P(ctypes.c_int64), c_char_p, c_size_t]),
        "dl_api_candidate_open": (c_int, [c_void_p, c_char_p, ctypes.c_uint, P(c_void_p), c_char_p,
                                          c_size_t]),
        "dl_api_candidate_save": (c_int, [c_void_p, c_char_p, c_char_p, c_int, c_char_p, c_size_t]),
        "dl_api_candidate_free": (None, [c_void_p]),
        "dl_api_check": (c_int, [c_void_p, c_void_p, c_char_p, P(c_void_p), c_char_p, c_size_t]),
        "dl_api_check_ex": (c_int, [c_void_p, c_void_p, c_char_p, PROGRESS, c_void_p, P(c_void_p),
                                    c_char_p, c_size_t]),
        "dl_api_report_text": (c_void_p, [c_void_p, c_char_p, c_int]),
        "dl_api_report_conformant": (c_int, [c_void_p]),
        "dl_api_report_free": (None, [c_void_p]),
        "dl_err_name": (c_char_p, [c_int]),
        "dl_strerror": (c_char_p, [c_int]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args


def lib():
    """The loaded library (loads it on first call); raises Error when none
    can be found or it is not the API version this package speaks."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, path in _candidates():
            try:
                cand = ctypes.CDLL(path)
                _declare(cand)
            except (OSError, AttributeError) as e:
                tried.append("%s %s: %s" % (how, path, e))
                continue
            v = cand.dl_api_version()
            if v != API_VERSION:
                tried.append("%s %s: API version %d, this package speaks %d" % (how, path, v,
                                                                                API_VERSION))
                continue
            _lib = cand
            _lib.dropless_path = path
            _lib.dropless_how = how
            return _lib
        raise Error("libdropless not found (reinstall the package from the dropless sources, or "
                    "set DROPLESS_LIB to the path of libdropless.so); tried: "
                    + "; ".join(tried), None, None)


def code_of(name):
    """The code of a symbolic error name ("DL_EDTYPE")."""
    L = lib()
    for code in range(-1, -64, -1):
        n = L.dl_err_name(code)
        if n is None or n == b"DL_UNKNOWN":
            break
        if n.decode() == name:
            return code
    raise KeyError(name)


def fail(code, message):
    """Raises the Error for a C return code and its message."""
    L = lib()
    name = L.dl_err_name(code).decode()
    raise Error(message or L.dl_strerror(code).decode(), code, name)


def error(name, message):
    """An Error with the library's code for a symbolic name, for refusals
    made on the Python side before anything reaches the library (an object
    that is not an array)."""
    return Error(message, code_of(name), name)


def call(fname, *args):
    """Calls a function that takes (..., err, errlen) last; raises Error."""
    err = ctypes.create_string_buffer(ERRLEN)
    rc = getattr(lib(), fname)(*args, err, ERRLEN)
    if rc != 0:
        fail(rc, err.value.decode("utf-8", "replace"))
    return rc


def text(ptr):
    """A malloc'ed C text as str (freed); None stays None."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().dl_api_free_text(ptr)
