"""The FFI handler (ffi.c): a prebuilt one, or compiled once into a cache.

Where the handler comes from, in order:
  DROPLESS_JAX_FFI   the path of a prebuilt handler library (no compiler needed);
  the package's      libdropless_jax_ffi.so beside this file, built at install
                     (python/setup.py) against the shipped headers;
  the cache          ${DROPLESS_JAX_CACHE:-${XDG_CACHE_HOME:-~/.cache}/dropless/jax-ffi}/<key>/,
                     compiled on first use with $CC (default cc), the key a hash of
                     ffi.c, the dropless headers, XLA's FFI header, the jax version
                     and the compiler command, so a change to any of them builds anew.
The handler is linked against nothing: its libdropless symbols bind to the
library the package loaded (made global first), so the FFI and the ctypes
side are one copy of the oracle.
"""

import ctypes
import glob
import hashlib
import os
import shlex
import subprocess
import tempfile

import jax

from .. import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "ffi.c")
NAME = "libdropless_jax_ffi.so"


def _error(msg):
    return _lib.error("DL_EPLUGIN", "dropless.jax: " + msg)


def _include_dirs():
    """Directories holding dropless.h: DROPLESS_INCLUDE, the checkout the
    package sits in, the installed headers (pkg-config, beside the library)."""
    cands = [os.environ.get("DROPLESS_INCLUDE", ""), os.path.join(HERE, "..", "_native", "include"),
             os.path.join(HERE, "..", "..", "..", "include")]
    try:
        cands.append(subprocess.run(["pkg-config", "--variable=includedir", "dropless"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    libpath = _lib.lib().dropless_path
    if os.path.dirname(libpath):
        cands.append(os.path.join(os.path.dirname(os.path.realpath(libpath)), "..", "include"))
    return [os.path.abspath(c) for c in cands if c and os.path.isfile(os.path.join(c, "dropless.h"))]


def _command(out):
    inc = _include_dirs()
    if not inc:
        raise _error("no dropless.h to build the FFI handler against (set DROPLESS_INCLUDE to "
                     "the include directory of the dropless sources, or DROPLESS_JAX_FFI to a "
                     "prebuilt handler)")
    cc = shlex.split(os.environ.get("CC") or "cc")
    return cc + ["-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                 "-I" + jax.ffi.include_dir(), "-I" + inc[0], SOURCE, "-o", out]


def _key(cmd):
    """The cache key: everything the handler's bytes depend on."""
    h = hashlib.sha256()
    inc = [a[2:] for a in cmd if a.startswith("-I")]
    files = [SOURCE, os.path.join(inc[0], "xla", "ffi", "api", "c_api.h")]
    files += sorted(glob.glob(os.path.join(inc[1], "dropless.h")) +
                    glob.glob(os.path.join(inc[1], "dropless", "*.h")))
    for path in files:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + f.read() + b"\0")
    h.update(("jax %s\0%s" % (jax.__version__, " ".join(cmd[:-1]))).encode())
    return h.hexdigest()[:24]


def _compile():
    """The cached handler's path, compiled first when absent."""
    cache = os.environ.get("DROPLESS_JAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dropless", "jax-ffi")
    probe = _command("OUT")
    path = os.path.join(cache, _key(probe), NAME)
    if os.path.isfile(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        r = subprocess.run(_command(tmp), capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-6:]) or \
                "exit status %d, no message" % r.returncode
            raise _error("compiling the FFI handler failed (%s): %s; set DROPLESS_JAX_FFI to a "
                         "prebuilt handler" % (" ".join(_command(tmp)), tail))
        os.replace(tmp, path)  # atomic: a concurrent build finds a whole file or none
    except OSError as e:
        raise _error("cannot build the FFI handler with %s: %s (set CC, or DROPLESS_JAX_FFI to "
                     "a prebuilt handler)" % (probe[0], e)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def handler_path():
    """The handler library in use: DROPLESS_JAX_FFI, else the one built at
    install (when it exists and the library loaded is the package's own),
    else the cached build."""
    env = os.environ.get("DROPLESS_JAX_FFI")
    if env:
        return env
    shipped = os.path.join(HERE, NAME)
    if os.path.isfile(shipped) and _lib.lib().dropless_how == "package":
        return shipped
    return _compile()


def load():
    """The handler, loaded, with libdropless made global beneath it; raises
    dropless.Error when it cannot be built or loaded or was built against
    another API version of the library."""
    L = _lib.lib()
    ctypes.CDLL(L.dropless_path, mode=ctypes.RTLD_GLOBAL)  # promotes the loaded copy
    path = handler_path()
    try:
        h = ctypes.CDLL(path)
    except OSError as e:
        raise _error("cannot load the FFI handler %s: %s" % (path, e)) from None
    try:
        v = h.dl_jax_ffi_api_version()
    except AttributeError:
        raise _error("%s is not a dropless FFI handler" % path) from None
    if v != L.dl_api_version():
        raise _error("the FFI handler %s was built for API version %d, the library is %d: rebuild "
                     "it" % (path, v, L.dl_api_version()))
    h.dropless_path = path
    return h
