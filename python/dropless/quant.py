"""Low-precision formats and block-scaled quantization: FP8 E4M3 and E5M2,
FP4 E2M1, the UE8M0 scale (doc/lowprecision.md).

Thin over libdropless (dropless/lowp.h, quant.h, quantcheck.h): every
encode, decode, quantization and check is the C library's; this module
moves numpy arrays across and names things. ``to_ml_dtypes`` views codes as
ml_dtypes's types where ml_dtypes has the format.

    >>> from dropless import quant
    >>> quant.decode(quant.encode([1.0, 500.0], "e4m3"), "e4m3")
    array([  1., 448.])
    >>> q, s = quant.quantize(x, "deepseek-v3-act")       # 1x128 tiles, fp32 scales
    >>> quant.check(x, q, s, "deepseek-v3-act")["verdict"]
    'CONFORMANT: ...'
"""

import ctypes

import numpy as np

from . import _lib

FORMATS = ("e4m3", "e5m2", "e2m1", "ue8m0")
ROUNDING = {"rne": 0, "ties-away": 1, "toward-zero": 2, "up": 3, "down": 4, "ties-toward-zero": 5}
SCALES = {"fp32": 0, "ue8m0": 1, "e4m3": 2}
SCALE_RULES = {"div": 0, "ceil": 1, "mx": 2, "floor": 3, "log2": 4, "log2+1": 5}
FLAGS = {"reciprocal-multiply": 1, "pow2-after-quantize": 2, "no-saturation": 4, "packed": 8,
         "multiply-fmax-over-amax": 16, "fp32-division": 32}
ML_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1fn",
             "ue8m0": "float8_e8m0fnu"}

class _Rule(ctypes.Structure):
    _fields_ = [("elem", ctypes.c_int), ("scale", ctypes.c_int), ("br", ctypes.c_int64),
                ("bc", ctypes.c_int64), ("srule", ctypes.c_int), ("eround", ctypes.c_int),
                ("flags", ctypes.c_uint), ("amax_floor", ctypes.c_float),
                ("global_", ctypes.c_float)]


class _Mat(ctypes.Structure):
    _fields_ = [("rule", ctypes.POINTER(_Rule)), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("q", ctypes.c_void_p), ("s", ctypes.c_void_p)]


class _Check(ctypes.Structure):
    _fields_ = [("conformant", ctypes.c_int), ("elements", ctypes.c_int64),
                ("blocks", ctypes.c_int64), ("elem_diff", ctypes.c_int64),
                ("scale_diff", ctypes.c_int64), ("first_elem", ctypes.c_int64 * 2),
                ("cand_code", ctypes.c_uint), ("want_code", ctypes.c_uint),
                ("first_block", ctypes.c_int64 * 2), ("cand_scale", ctypes.c_double),
                ("want_scale", ctypes.c_double), ("variant", ctypes.c_int),
                ("defect", ctypes.c_int)]


class _GemmCheck(ctypes.Structure):
    _fields_ = [("checked", ctypes.c_int64), ("failed", ctypes.c_int64),
                ("first", ctypes.c_int64 * 2), ("worst_ratio", ctypes.c_double),
                ("cand", ctypes.c_double), ("want", ctypes.c_double), ("tol", ctypes.c_double)]


class _LayerRow(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("x", ctypes.c_char_p), ("w", ctypes.c_char_p),
                ("h", ctypes.c_char_p), ("dgrad", ctypes.c_int)]


PROFILES = {"exact": 0, "fp32": 1, "hopper": 2}
OUT_DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}

_declared = None


def _L():
    global _declared
    L = _lib.lib()
    if _declared is not L:
        P, vp, i64 = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int64
        sig = {
            "dl_qencode_array": (ctypes.c_size_t, [vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                   ctypes.c_int, vp]),
            "dl_qdecode_array": (None, [vp, ctypes.c_size_t, ctypes.c_int, vp]),
            "dl_fp4_pack": (None, [vp, ctypes.c_size_t, vp]),
            "dl_fp4_unpack": (None, [vp, ctypes.c_size_t, vp]),
            "dl_ue8m0_pack": (None, [vp, ctypes.c_size_t, vp]),
            "dl_ue8m0_unpack": (None, [vp, ctypes.c_size_t, vp]),
            "dl_quant_qbytes": (i64, [P(_Rule), i64, i64]),
            "dl_quant_sbytes": (i64, [P(_Rule), i64, i64]),
            "dl_quant_rule_check": (ctypes.c_int, [P(_Rule), i64]),
            "dl_quantize": (ctypes.c_int, [P(_Rule), vp, i64, i64, vp, vp]),
            "dl_dequant": (ctypes.c_double, [P(_Mat), i64, i64]),
            "dl_nvfp4_global": (ctypes.c_float, [vp, i64]),
            "dl_quant_recipe": (ctypes.c_int, [ctypes.c_char_p, P(_Rule)]),
            "dl_quant_recipe_name": (ctypes.c_char_p, [ctypes.c_int]),
            "dl_qcheck": (ctypes.c_int, [P(_Rule), vp, i64, i64, P(_Mat), P(_Check)]),
            "dl_qcheck_format": (ctypes.c_int, [P(_Check), ctypes.c_char_p, ctypes.c_size_t]),
            "dl_qvariant_name": (ctypes.c_char_p, [ctypes.c_int]),
            "dl_qdefect_name": (ctypes.c_char_p, [ctypes.c_int]),
            "dl_lowp_layer": (P(_LayerRow), [ctypes.c_int]),
            "dl_lowp_layer_parse": (ctypes.c_int, [ctypes.c_char_p]),
            "dl_qcheck_gemm": (ctypes.c_int, [P(_Mat), P(_Mat), i64, vp, ctypes.c_int, ctypes.c_int,
                                              vp, P(_GemmCheck)]),
        }
        for name, (res, args) in sig.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        _declared = L
    return L


def _fmt(name):
    if name not in FORMATS:
        raise ValueError("unknown format %r (one of %s)" % (name, ", ".join(FORMATS)))
    return FORMATS.index(name)


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def encode(x, fmt, rounding="rne", saturate=True):
    """Codes (uint8, one per element, FP4 unpacked) of x rounded once to fmt."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty(x.shape, dtype=np.uint8)
    if rounding not in ROUNDING:
        raise ValueError("unknown rounding %r (one of %s)" % (rounding, ", ".join(ROUNDING)))
    _L().dl_qencode_array(_ptr(x), x.size, _fmt(fmt), ROUNDING[rounding], int(saturate), _ptr(out))
    return out


def decode(codes, fmt):
    """The exact values (float64) of codes of fmt."""
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    out = np.empty(c.shape, dtype=np.float64)
    _L().dl_qdecode_array(_ptr(c), c.size, _fmt(fmt), _ptr(out))
    return out


def pack_fp4(codes):
    """Two E2M1 codes per byte: element 2i low nibble, 2i+1 high nibble."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).ravel()
    out = np.empty((c.size + 1) // 2, dtype=np.uint8)
    _L().dl_fp4_pack(_ptr(c), c.size, _ptr(out))
    return out


def unpack_fp4(packed, n):
    p = np.ascontiguousarray(packed, dtype=np.uint8).ravel()
    if p.size * 2 < n:
        raise ValueError("%d bytes hold fewer than %d FP4 codes" % (p.size, n))
    out = np.empty(n, dtype=np.uint8)
    _L().dl_fp4_unpack(_ptr(p), n, _ptr(out))
    return out


def pack_ue8m0(codes):
    """Four UE8M0 codes per int32 (DeepGEMM on SM100): code 4g+i in byte i of word g."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).ravel()
    out = np.empty((c.size + 3) // 4, dtype=np.uint32)
    _L().dl_ue8m0_pack(_ptr(c), c.size, _ptr(out))
    return out.view(np.int32)


def unpack_ue8m0(words, n):
    w = np.ascontiguousarray(words).view(np.uint32).ravel()
    if w.size * 4 < n:
        raise ValueError("%d words hold fewer than %d UE8M0 codes" % (w.size, n))
    out = np.empty(n, dtype=np.uint8)
    _L().dl_ue8m0_unpack(_ptr(w), n, _ptr(out))
    return out


def to_ml_dtypes(codes, fmt):
    """The codes viewed as ml_dtypes's type for fmt (FP4 unpacked), or None."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    t = getattr(ml_dtypes, ML_DTYPES[fmt], None)
    return None if t is None else np.ascontiguousarray(codes, dtype=np.uint8).view(t)


def recipes():
    """The names of the recipes' declared rules (the C table DL_QRECIPE_MAP)."""
    L, out, i = _L(), [], 0
    while L.dl_quant_recipe_name(i):
        out.append(L.dl_quant_recipe_name(i).decode())
        i += 1
    return out


def rule(name_or_dict, **changes):
    """A rule: a recipe name (recipes()) or a dict of elem, scale, block,
    srule, rounding, flags, amax_floor, global_scale; changes override
    those keys (flags replace the recipe's)."""
    L = _L()
    d = {} if isinstance(name_or_dict, str) else dict(name_or_dict)
    d.update(changes)
    r = _Rule()
    if isinstance(name_or_dict, str):
        if L.dl_quant_recipe(name_or_dict.encode(), ctypes.byref(r)):
            raise ValueError("unknown recipe %r (one of %s)" % (name_or_dict, ", ".join(recipes())))
    else:
        r.srule, r.eround, r.global_ = SCALE_RULES["div"], ROUNDING["rne"], 1.0
    if "elem" in d:
        r.elem = _fmt(d["elem"])
    if "scale" in d:
        r.scale = SCALES[d["scale"]]
    if "block" in d:
        r.br, r.bc = d["block"]
    if "srule" in d:
        r.srule = SCALE_RULES[d["srule"]]
    if "rounding" in d:
        r.eround = ROUNDING[d["rounding"]]
    if "flags" in d:
        r.flags = sum(FLAGS[f] for f in d["flags"])
    if "amax_floor" in d:
        r.amax_floor = d["amax_floor"]
    if "global_scale" in d:
        r.global_ = d["global_scale"]
    if L.dl_quant_rule_check(ctypes.byref(r), -1):
        raise ValueError("inconsistent quantization rule %r" % (name_or_dict,))
    return r


def _rule_for(r, x):
    """r as a rule; an NVFP4 rule without a global scale gets x's."""
    rr = r if isinstance(r, _Rule) else rule(r)
    given = isinstance(r, dict) and "global_scale" in r
    if rr.scale == SCALES["e4m3"] and not isinstance(r, _Rule) and not given:
        rr.global_ = nvfp4_global(x)
    return rr


def nvfp4_global(x):
    """NVFP4's fp32 global scale of a tensor: RN_fp32(amax / (6 * 448))."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return float(_L().dl_nvfp4_global(_ptr(x), x.size))


def quantize(x, r):
    """(q, s) of a 2-D float32 array under rule r (a name, dict or rule()):
    q the element codes (FP4 packed), s the scales (float32 values, uint8
    codes, or int32 words when packed), as the C layout says."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("quantize takes a 2-D array, got shape %s" % (x.shape,))
    rr = _rule_for(r, x)
    L, (rows, cols) = _L(), x.shape
    if L.dl_quant_rule_check(ctypes.byref(rr), cols):
        raise ValueError("rule does not fit %d columns (FP4 needs an even count)" % cols)
    q = np.zeros(L.dl_quant_qbytes(ctypes.byref(rr), rows, cols), dtype=np.uint8)
    s = np.zeros(L.dl_quant_sbytes(ctypes.byref(rr), rows, cols), dtype=np.uint8)
    rc = L.dl_quantize(ctypes.byref(rr), _ptr(x), rows, cols, _ptr(q), _ptr(s))
    if rc:
        _lib.fail(rc, "quantize: %s" % L.dl_strerror(rc).decode())
    if rr.scale == SCALES["fp32"]:
        s = s.view(np.float32)
    elif rr.flags & FLAGS["packed"]:
        s = s.view(np.int32)
    return q, s


def dequantize(q, s, r, shape, global_scale=None):
    """The exact dequantized values (float64) of (q, s) under rule r."""
    rr = r if isinstance(r, _Rule) else rule(r, **({} if global_scale is None else
                                                   {"global_scale": global_scale}))
    q = np.ascontiguousarray(q, dtype=np.uint8)
    s = np.ascontiguousarray(s)
    m = _Mat(ctypes.pointer(rr), shape[0], shape[1], _ptr(q), _ptr(s))
    L = _L()
    return np.array([[L.dl_dequant(ctypes.byref(m), i, j) for j in range(shape[1])]
                     for i in range(shape[0])])


def check(x, q, s, r):
    """Checks a candidate's quantized bytes q and scales s of x against rule
    r: a dict with conformant, verdict (one line), variant (the named rule
    they follow instead, or None), defect (the layout defect, or None) and
    the counts and first differences."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rr = _rule_for(r, x)
    L = _L()
    rows, cols = x.shape
    qb, sb = L.dl_quant_qbytes(ctypes.byref(rr), rows, cols), L.dl_quant_sbytes(ctypes.byref(rr), rows, cols)
    q = np.ascontiguousarray(q).view(np.uint8).ravel()
    s = np.ascontiguousarray(s).view(np.uint8).ravel()
    if q.size != qb or s.size != sb:
        raise ValueError("candidate holds %d element bytes and %d scale bytes, the rule needs %d and %d"
                         % (q.size, s.size, qb, sb))
    m = _Mat(ctypes.pointer(rr), rows, cols, _ptr(q), _ptr(s))
    res = _Check()
    rc = L.dl_qcheck(ctypes.byref(rr), _ptr(x), rows, cols, ctypes.byref(m), ctypes.byref(res))
    if rc:
        _lib.fail(rc, "check: %s" % L.dl_strerror(rc).decode())
    buf = ctypes.create_string_buffer(2048)
    L.dl_qcheck_format(ctypes.byref(res), buf, len(buf))
    name = L.dl_qvariant_name(res.variant) if res.variant >= 0 else None
    defect = L.dl_qdefect_name(res.defect) if res.defect >= 0 else None
    return dict(conformant=bool(res.conformant), verdict=buf.value.decode(),
                variant=name.decode() if name else None, defect=defect.decode() if defect else None,
                elements=res.elements, elem_diff=res.elem_diff, scale_diff=res.scale_diff,
                first_elem=tuple(res.first_elem), first_block=tuple(res.first_block))


def _golden_lowp(path):
    """The /lowp group of a `dropless lowp` file as numpy arrays and attributes."""
    import h5py
    with h5py.File(path, "r") as f:
        if "lowp" not in f:
            raise ValueError("%s: no /lowp group (not a `dropless lowp` golden)" % path)
        g = f["lowp"]
        d = {k: g[k][()] for k in g}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
    return d, attrs


def check_gemm(golden, cand, profile="exact"):
    """Checks a candidate's output cand [M, N] of a `dropless lowp` golden
    file's block-scaled grouped GEMM (the path golden) under an accumulation
    profile ("exact", "fp32": TOSA's per-block fp32 partial sums, "hopper":
    14-bit accumulation promoted every 128 products), through
    dl_qcheck_gemm on the file's quantized operands. Returns a dict: checked,
    failed, worst_ratio (max |cand - golden| / tolerance), first ((row, col)
    of the worst failure, or None), cand, want, tol (at the worst element)
    and conformant (every output checked within its tolerance, at least one
    checked)."""
    if profile not in PROFILES:
        raise ValueError("unknown profile %r (one of %s)" % (profile, ", ".join(PROFILES)))
    d, at = _golden_lowp(golden)
    x, w, off = d["x"], d["w"], np.ascontiguousarray(d["offsets"], dtype=np.int64)
    E, N, K = w.shape
    M = x.shape[0]
    cand = np.ascontiguousarray(cand, dtype=np.float32)
    if cand.shape != (M, N):
        raise ValueError("candidate has shape %s, the golden's output is (%d, %d)" % (cand.shape, M, N))
    keep = [x, off, cand]
    if at["a_recipe"] == "bf16":
        xa = np.ascontiguousarray(x, dtype=np.float32)
        keep.append(xa)
        a = _Mat(None, M, K, None, _ptr(xa))
    else:
        ra = rule(at["a_recipe"], global_scale=float(at["a_global"]))
        aq, as_ = np.ascontiguousarray(d["a_q"]), np.ascontiguousarray(d["a_s"])
        keep += [ra, aq, as_]
        a = _Mat(ctypes.pointer(ra), M, K, _ptr(aq), _ptr(as_))
    rb = rule(at["b_recipe"], global_scale=float(at["b_global"]))
    bq, bs = np.ascontiguousarray(d["b_q"]), np.ascontiguousarray(d["b_s"])
    b = _Mat(ctypes.pointer(rb), N, K, _ptr(bq), _ptr(bs))
    res = _GemmCheck()
    L = _L()
    rc = L.dl_qcheck_gemm(ctypes.byref(a), ctypes.byref(b), E, _ptr(off), OUT_DTYPES[at["out_dtype"]],
                          PROFILES[profile], _ptr(cand), ctypes.byref(res))
    if rc:
        _lib.fail(rc, "check_gemm: %s: %s" % (golden, L.dl_strerror(rc).decode()))
    first = tuple(res.first) if res.failed and res.first[0] >= 0 else None
    return dict(checked=res.checked, failed=res.failed, worst_ratio=res.worst_ratio, first=first,
                cand=res.cand, want=res.want, tol=res.tol,
                conformant=res.checked > 0 and res.failed == 0)


def layer_recipe(name):
    """A layer recipe (the C table DL_LOWP_LAYER_MAP) by name: a dict of the
    recipe names of its operands, x (the gate/up input; None: unquantized),
    w (the expert weights), h (the down projection's input) and dgrad (the
    activation-gradient GEMMs quantized under x)."""
    L = _L()
    i = L.dl_lowp_layer_parse(name.encode())
    p = L.dl_lowp_layer(i) if i > 0 else None
    if not p:
        raise ValueError("unknown layer recipe %r" % (name,))
    r = p.contents
    dec = (lambda b: b.decode() if b else None)
    return dict(name=dec(r.name), x=dec(r.x), w=dec(r.w), h=dec(r.h), dgrad=bool(r.dgrad))


# a layer golden's value -> (its dataset, the recipe row's key for its rule)
_LAYER_OPERANDS = {"x_sorted": ("forward/x_sorted", "x"), "h_act": ("forward/h_act", "h"),
                   "d_y_sorted": ("backward/d_y_sorted", "x")}


def check_layer(golden, value, cand):
    """Checks a candidate's quantized operand of a layer recipe's golden
    (a catalogue case with /config/lowp): value is "x_sorted" (the gate/up
    input: 1 x bc tiles are per row, so x quantized before the dispatch
    gives the same rows), "h_act" (the down projection's input) or
    "d_y_sorted" (dgrad recipes); cand is one (codes, scales) pair per
    expert (None for an expert without rows), each expert's rows quantized
    on their own as the recipe does (an NVFP4 global scale per expert).
    Each expert is judged by check() under the recipe's rule, which names
    the variant or defect a non-conformant one follows. Returns a dict:
    conformant (every expert with rows conformant, at least one checked),
    rule, experts (the per-expert check() dicts, None where no rows) and
    first (the first non-conformant expert, or None)."""
    import h5py
    if value not in _LAYER_OPERANDS:
        raise ValueError("value must be one of %s" % ", ".join(_LAYER_OPERANDS))
    ds, key = _LAYER_OPERANDS[value]
    with h5py.File(golden, "r") as f:
        lp = f["config"].attrs.get("lowp")
        if lp is None:
            raise ValueError("%s: no /config/lowp: not a layer recipe's golden" % golden)
        rec = layer_recipe(lp.decode() if isinstance(lp, bytes) else lp)
        if value == "d_y_sorted" and not rec["dgrad"]:
            raise ValueError("%s: recipe %s does not quantize the backward" % (golden, rec["name"]))
        if ds not in f:
            raise ValueError("%s: no %s" % (golden, ds))
        a, off = f[ds][()], f["forward/group_offsets"][()]
    r = rec[key]
    if r is None:
        raise ValueError("recipe %s leaves %s unquantized" % (rec["name"], value))
    if len(cand) != len(off) - 1:
        raise ValueError("candidate has %d experts, the golden %d" % (len(cand), len(off) - 1))
    experts, first = [], None
    for e in range(len(off) - 1):
        if off[e + 1] == off[e]:
            experts.append(None)
            continue
        if cand[e] is None:
            raise ValueError("expert %d has rows and no candidate bytes" % e)
        v = check(a[off[e]:off[e + 1]], cand[e][0], cand[e][1], r)
        experts.append(v)
        if first is None and not v["conformant"]:
            first = e
    checked = any(v is not None for v in experts)
    return dict(conformant=checked and first is None, rule=r, experts=experts, first=first)
