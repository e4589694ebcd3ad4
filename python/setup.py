"""Builds the package with libdropless inside it (doc/python.md, "Installing").

Where the library comes from, in order:
  DROPLESS_BUILD_DIR  a configured dropless build directory: `make
                      libdropless.la` there (nothing to do when up to date),
                      and its .libs/libdropless.so is taken;
  the source tree     python/.. (a checkout or the `make dist` tarball) or
                      _csrc/ (this package's sdist): configured in place
                      already, `make libdropless.la` there; else configured
                      and built in this build's temporary directory
                      (autoreconf first where a checkout has no configure).
Shipped with it, under dropless/_native/: libdropless.so and the public
headers (include/dropless.h, include/dropless/*.h); under dropless/jax/:
the JAX FFI handler (ffi.c) compiled against those headers and XLA's FFI C
API header (vendored: dropless/jax/xla/ffi/api/c_api.h), with $CC (cc).
A handler that cannot be compiled here is compiled at first use instead.
The build needs what ./configure needs (README.md: OpenBLAS, HDF5, MPFR,
DLPack, Check, a C compiler with OpenMP; autotools for a bare checkout).
"""

import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
# What building libdropless needs of the project, copied into sdists (_csrc/).
SOURCES = ["configure.ac", "Makefile.am", "mk", "m4", "src", "include", "dropless.pc.in",
           "build-aux", "configure", "Makefile.in", "aclocal.m4", "config.h.in"]
BUILD_LEFTOVERS = shutil.ignore_patterns("*.o", "*.lo", "*.la", ".libs", ".deps", ".dirstamp",
                                         "*.inc")


def _log(msg):
    print("dropless build: " + msg, file=sys.stderr, flush=True)


def _run(cmd, cwd):
    _log("%s (in %s)" % (" ".join(cmd), cwd))
    r = subprocess.run(cmd, cwd=cwd)
    if r.returncode != 0:
        raise SystemExit("dropless build: %s failed (exit status %d) in %s; building libdropless "
                         "needs what ./configure needs (README.md), or set DROPLESS_BUILD_DIR to a "
                         "built dropless tree" % (cmd[0], r.returncode, cwd))


def project_root():
    """The dropless sources this package is built from, or None."""
    for cand in (os.path.join(HERE, "_csrc"), os.path.dirname(HERE)):
        if os.path.isfile(os.path.join(cand, "configure.ac")) and \
                os.path.isfile(os.path.join(cand, "src", "api", "golden.c")):
            return cand
    return None


def source_dir():
    """The sources the library was built from: DROPLESS_BUILD_DIR's
    (abs_top_srcdir of its Makefile: a VPATH build), else project_root()."""
    given = os.environ.get("DROPLESS_BUILD_DIR")
    if given:
        with open(os.path.join(given, "Makefile")) as f:
            for line in f:
                if line.startswith("abs_top_srcdir = "):
                    return line.split("=", 1)[1].strip()
    return project_root()


def _make(builddir):
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    _run(["make", "-j" + jobs, "libdropless.la"], builddir)
    lib = os.path.join(builddir, ".libs", "libdropless.so")
    if not os.path.isfile(lib):
        raise SystemExit("dropless build: no %s after make" % lib)
    return lib


def build_library(tmp):
    """The path of an up-to-date libdropless.so (see the module's text)."""
    given = os.environ.get("DROPLESS_BUILD_DIR")
    if given:
        if not os.path.isfile(os.path.join(given, "config.status")):
            raise SystemExit("dropless build: DROPLESS_BUILD_DIR=%s is not a configured dropless "
                             "build directory" % given)
        return _make(given)
    root = project_root()
    if root is None:
        raise SystemExit("dropless build: no dropless sources beside python/ (build from a "
                         "checkout, the `make dist` tarball or this package's sdist), and no "
                         "DROPLESS_BUILD_DIR")
    if os.path.isfile(os.path.join(root, "config.status")):
        return _make(root)  # configured in place: the same tree the CLI is built in
    if not os.path.isfile(os.path.join(root, "configure")):
        _run(["autoreconf", "-fi"], root)
    os.makedirs(tmp, exist_ok=True)
    if not os.path.isfile(os.path.join(tmp, "config.status")):
        _run([os.path.join(root, "configure"), "-q", "--without-mpi"], tmp)
    return _make(tmp)


def _headers(root_include, dest):
    os.makedirs(os.path.join(dest, "dropless"), exist_ok=True)
    shutil.copy2(os.path.join(root_include, "dropless.h"), dest)
    sub = os.path.join(root_include, "dropless")
    for name in sorted(os.listdir(sub)):
        if name.endswith(".h"):
            shutil.copy2(os.path.join(sub, name), os.path.join(dest, "dropless"))


def build_handler(pkg, include):
    """Compiles dropless/jax/ffi.c into pkg/jax/libdropless_jax_ffi.so;
    False (and a note) where it cannot be."""
    src = os.path.join(HERE, "dropless", "jax", "ffi.c")
    out = os.path.join(pkg, "jax", "libdropless_jax_ffi.so")
    cmd = shlex.split(os.environ.get("CC") or "cc") + [
        "-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
        "-I" + os.path.join(HERE, "dropless", "jax"), "-I" + include, src, "-o", out]
    _log(" ".join(cmd))
    try:
        ok = subprocess.run(cmd).returncode == 0
    except OSError as e:
        _log("cannot run the C compiler: %s" % e)
        ok = False
    if not ok:
        _log("the JAX FFI handler was not built; dropless.jax compiles it at first use")
    return ok


class BuildPy(build_py):
    """build_py, then the library, the headers and the FFI handler."""

    def run(self):
        super().run()
        if self.dry_run:
            return
        pkg = os.path.join(self.build_lib, "dropless")
        native = os.path.join(pkg, "_native")
        os.makedirs(native, exist_ok=True)
        lib = build_library(os.path.join(os.path.abspath(self.build_lib), "..", "libdropless-build"))
        shutil.copyfile(os.path.realpath(lib), os.path.join(native, "libdropless.so"))
        _headers(os.path.join(source_dir(), "include"), os.path.join(native, "include"))
        build_handler(pkg, os.path.join(native, "include"))


class Sdist(sdist):
    """sdist, with the project's sources under _csrc/ (what BuildPy
    compiles the library from)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = project_root()
        if root is None:
            raise SystemExit("dropless sdist: no dropless sources beside python/")
        if not os.path.isfile(os.path.join(root, "configure")):
            _run(["autoreconf", "-fi"], root)
        dest = os.path.join(base_dir, "_csrc")
        for name in SOURCES:
            src = os.path.join(root, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(dest, name), ignore=BUILD_LEFTOVERS,
                                dirs_exist_ok=True)
            elif os.path.isfile(src):
                os.makedirs(dest, exist_ok=True)
                shutil.copy2(src, os.path.join(dest, name))


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: platform-specific, not pure."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist}, distclass=BinaryDistribution)
