"""Mutated candidates: the oracle's test of itself (doc/power.md).

    import dropless
    g = dropless.load("vectors/mixtral-small.h5")
    rows = dropless.mutate(g, "mutants/")              # files + manifest rows
    rep, detail = dropless.mutant_check(g, "drop_slot", "out", "out")

Each mutant is one stage of the golden computed wrongly (a gain 1 + 2^-p, a
sign, a zeroed row, an off-by-one group boundary, a dropped slot, two
experts swapped, bf16 accumulation, TF32 products, one expert's weights an
ulp off) or legitimately otherwise (rows reordered within an expert, which
must pass), everything downstream recomputed by the C library's stage
functions; handed over per mode: "staged" (every stage), "fused" (out,
d_x), "out". The C library does the work (dropless/mutate.h); this module
passes options and parses the manifest.
"""

import ctypes
import json

from . import _lib
from .golden import Golden, Record

_declared = False


def _L():
    global _declared
    L = _lib.lib()
    if not _declared:
        c_int, c_char_p, c_void_p, c_size_t = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
        P = ctypes.POINTER
        L.dl_api_mutate.restype = c_int
        L.dl_api_mutate.argtypes = [c_void_p, c_char_p, c_char_p, P(c_void_p), c_char_p, c_size_t]
        L.dl_api_mutant.restype = c_int
        L.dl_api_mutant.argtypes = [c_void_p, c_char_p, c_char_p, c_char_p, c_char_p, P(c_void_p),
                                    c_char_p, c_size_t, c_char_p, c_size_t]
        _declared = True
    return L


def _opts(mutations=None, stages=None, modes=None, gain_p=None, seed=0, force=False):
    lines = []
    for key, v in (("mutations", mutations), ("stages", stages), ("modes", modes)):
        if v is not None:
            lines.append("%s=%s" % (key, v if isinstance(v, str) else ",".join(v)))
    if gain_p is not None:
        lines.append("gain_p=%d" % int(gain_p))
    lines.append("seed=%d" % int(seed))
    lines.append("force=%d" % int(bool(force)))
    return "\n".join(lines).encode()


def _golden(golden):
    if not isinstance(golden, Golden):
        raise TypeError("golden must be a dropless.Golden (dropless.generate or dropless.load)")
    return golden._handle()


def parse_manifest(text):
    """manifest.tsv's text as Records (file None for an equivalent mutant)."""
    lines = [ln.split("\t") for ln in text.splitlines() if ln]
    head = lines[0]
    out = []
    for ln in lines[1:]:
        r = Record(zip(head, ln))
        r["file"] = None if r["file"] == "-" else r["file"]
        out.append(r)
    return out


def mutate(golden, directory, mutations=None, stages=None, modes=None, gain_p=None, seed=0,
           force=False):
    """Writes the mutants of golden (a dropless.Golden) into directory, as
    `dropless mutate` does: one candidate file per mutation x stage x mode
    that differs from the golden, and manifest.tsv. mutations, stages,
    modes: names (a list or a comma string; None: all); gain_p: the gain
    is 1 + 2^-gain_p (None: the case type's precision - 4); seed picks the
    rows, elements, slots and experts. An existing directory is replaced
    only with force=True (and only a directory of mutants). Returns the
    manifest's rows (file, mutation, stage, mode, expect, detail); raises
    dropless.Error on bad input, leaving nothing at directory."""
    h = _golden(golden)
    L = _L()
    man = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_lib.ERRLEN)
    rc = L.dl_api_mutate(h, str(directory).encode(), _opts(mutations, stages, modes, gain_p, seed, force),
                         ctypes.byref(man), err, _lib.ERRLEN)
    if rc:
        _lib.fail(rc, err.value.decode("utf-8", "replace"))
    return parse_manifest(_lib.text(man.value))


def mutant_check(golden, mutation, stage, mode, gain_p=None, seed=0, **check_options):
    """Builds one mutant in memory and checks it, without files. Returns
    (report, detail): report is the check's JSON report as a dict; detail
    says what the mutation picked. Returns None when no such mutant
    exists (the mutation does not apply to the stage here, or the mode's
    stages equal the golden's). check_options as dropless.check's library
    options ("profile", "stages", ...)."""
    h = _golden(golden)
    L = _L()
    cand = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_lib.ERRLEN)
    detail = ctypes.create_string_buffer(256)
    rc = L.dl_api_mutant(h, mutation.encode(), stage.encode(), mode.encode(),
                         _opts(gain_p=gain_p, seed=seed), ctypes.byref(cand), detail, 256, err,
                         _lib.ERRLEN)
    if rc == _lib.code_of("DL_ENOTFOUND"):
        return None
    if rc:
        _lib.fail(rc, err.value.decode("utf-8", "replace"))
    try:
        opts = "\n".join("%s=%s" % kv for kv in check_options.items()).encode() or None
        r = ctypes.c_void_p()
        _lib.call("dl_api_check", h, cand, opts, ctypes.byref(r))
        try:
            rep = json.loads(_lib.text(L.dl_api_report_text(r, b"json", 0)))
        finally:
            L.dl_api_report_free(r)
    finally:
        L.dl_api_candidate_free(cand)
    return rep, detail.value.decode()
