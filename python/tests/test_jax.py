"""dropless.jax: the oracle as an XLA FFI target, its custom VJP, the
runner inside jit. Every value must be the C library's bits; bad inputs
must raise, never crash the process. SKIPs where JAX is absent."""
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (tools/setup_python.sh installs jax[cpu])")
import jax.numpy as jnp  # noqa: E402

import dropless  # noqa: E402
from dropless import jax as djax  # noqa: E402

# the targets are the CPU platform's: on a GPU machine too, these tests run
# their programs on the host (examples/jax_moe_ffi.py --device gpu is the
# GPU run)
jax.config.update("jax_default_device", jax.devices("cpu")[0])
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
# dropless.jax's moe_forward/moe_backward take no shared-expert weights yet
# (doc/python.md): the small cases without them (hash routing's included)
SMALL = [c.name for c in dropless.cases(large=False) if "shared_experts" not in c.config]
assert any("hash_vocab" in c.config for c in dropless.cases(large=False)
           if c.name in SMALL), "no hash-routing case left to test"
# one of each kind for the slower tests: fp32/bf16/fp16, bias and sigmoid,
# plain FFN, no tokens, group-limited routing with ties
KINDS = ["mixtral-small", "mixtral-small-bf16", "deepseek-v3-small-fp16", "plain-ffn-bf16",
         "no-tokens-bf16", "ties-grouped", "deepseek-v4-hash-bf16"]
FLOAT_INPUTS = ("x", "router_weight", "w_gate", "w_up", "w_down")


def jax_inputs(g):
    """The golden's inputs as JAX arrays of their storage types."""
    return {k: jnp.asarray(v) for k, v in g.inputs.as_storage("ml_dtypes").items()}


def layer_args(ins):
    kw = {k: v for k, v in ins.items() if k != "d_out"}
    kw.setdefault("w_gate", None)
    kw.setdefault("w_up", None)
    return kw


def bits(a):
    """An array's values as comparable bits: floats widened exactly to
    float32 (bf16 and fp16 are float32 values), integers as int64."""
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    return a.astype(np.float32).view(np.uint32)


def assert_same(got, golden_group, what):
    assert set(got) == set(n for n in golden_group if n != "tie_margin"), what
    for n, v in got.items():
        ref = golden_group[n]
        assert v.shape == ref.shape, "%s %s: shape %s, golden %s" % (what, n, v.shape, ref.shape)
        assert np.array_equal(bits(v), bits(ref)), "%s %s: not the golden's bits" % (what, n)


@pytest.fixture(scope="module")
def fwd():
    return jax.jit(lambda kw, g: djax.moe_forward(**kw, config=g), static_argnums=1)


@pytest.mark.parametrize("case", SMALL)
def test_ffi_bit_identical(case):
    """Forward stages, moe_backward and the custom VJP's backward (jax.vjp
    at the golden's d_out) are the golden's bits on every small case."""
    with dropless.generate(case) as g:
        ins = jax_inputs(g)
        kw = layer_args(ins)
        f = jax.jit(lambda kw: djax.moe_forward(**kw, config=g))
        out = f(kw)
        assert out["out"].dtype == ins["x"].dtype
        assert_same(out, g.forward, case + " forward")
        bwd = jax.jit(lambda kw, d: djax.moe_backward(**kw, d_out=d, config=g))(kw, ins["d_out"])
        assert_same(bwd, g.backward, case + " moe_backward")
        # the router-logit bias (softmax-topk) is differentiable like the weights
        names = [n for n in FLOAT_INPUTS + ("router_bias",) if kw.get(n) is not None]

        def layer(*a):
            return djax.moe_forward(**dict(kw, **dict(zip(names, a))), config=g)["out"]
        _, vjp = jax.vjp(layer, *[kw[n] for n in names])
        grads = jax.jit(vjp)(ins["d_out"])
        for n, gr in zip(names, grads):
            # cotangents have the primal's dtype: fp32 gradients of 16-bit
            # weights are the golden's rounded once (moe_backward: exact)
            ref = jnp.asarray(g.backward["d_" + n]).astype(gr.dtype)
            assert np.array_equal(bits(gr), bits(ref)), "%s vjp d_%s" % (case, n)


def test_bf16_matches_gen_file(cli, tmp_path):
    """The FFI's bf16 stages equal a `dropless gen` file's datasets."""
    path = tmp_path / "g.h5"
    subprocess.run([cli, "gen", "mixtral-small-bf16", "-o", str(path)], check=True,
                   capture_output=True)
    with dropless.load(path) as g:
        kw = layer_args(jax_inputs(g))
        assert kw["x"].dtype == jnp.bfloat16
        assert_same(jax.jit(lambda kw: djax.moe_forward(**kw, config=g))(kw), g.forward, "gen")


@pytest.mark.parametrize("case", KINDS)
def test_grad_equals_oracle_backward(case):
    """jax.grad of <out, d_out> through moe_forward is the oracle's backward;
    the bias gets no gradient; any dtype."""
    with dropless.generate(case) as g:
        ins = jax_inputs(g)
        kw = layer_args(ins)
        d_out = ins["d_out"].astype(jnp.float32)
        names = [n for n in FLOAT_INPUTS + ("expert_bias",) if kw.get(n) is not None]

        def loss(*a):
            out = djax.moe_forward(**dict(kw, **dict(zip(names, a))), config=g)["out"]
            return jnp.sum(out.astype(jnp.float32) * d_out)
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(names)))))(*[kw[n] for n in names])
        oracle = djax.moe_backward(**kw, d_out=ins["d_out"], config=g)
        for n, gr in zip(names, grads):
            assert gr.dtype == kw[n].dtype and gr.shape == kw[n].shape
            if n == "expert_bias":
                assert not np.any(np.asarray(gr))
                continue
            ref = oracle["d_" + n].astype(gr.dtype)
            assert np.array_equal(bits(gr), bits(ref)), "%s d_%s" % (case, n)
        assert np.array_equal(bits(oracle["d_x"]), bits(g.backward["d_x"]))


def test_one_compilation_for_every_routing():
    """Group sizes are data: one trace and one XLA compilation serve inputs
    of every routing (different seeds), forward and grad, each exact."""
    compiles, traces = [], []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)
    goldens = [dropless.generate("zipf-bf16", seed=s) for s in range(1, 7)]
    try:
        cfg = dict(goldens[0].config)

        @jax.jit
        def step(kw):
            traces.append(1)
            names = [n for n in FLOAT_INPUTS if kw[n] is not None]

            def loss(*a):
                return jnp.sum(djax.moe_forward(**dict(kw, **dict(zip(names, a))),
                                                config=cfg)["out"].astype(jnp.float32))
            out = djax.moe_forward(**kw, config=cfg)
            return out, jax.grad(loss, argnums=tuple(range(len(names))))(*[kw[n] for n in names])
        host = [jax.tree_util.tree_map(np.asarray, layer_args(jax_inputs(g))) for g in goldens]
        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            results = [step(kw) for kw in host]
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)
        sizes = {tuple(np.asarray(out["group_sizes"])) for out, _ in results}
        assert len(sizes) == len(goldens), "the seeds should route differently"
        assert len(traces) == 1 and len(compiles) == 1, (len(traces), len(compiles))
        assert step._cache_size() == 1
        for g, (out, _) in zip(goldens, results):
            assert_same(out, g.forward, g.case)
    finally:
        for g in goldens:
            g.close()


def test_bad_inputs_raise(fwd):
    g = dropless.generate("mixtral-small")
    kw = layer_args(jax_inputs(g))
    with pytest.raises(dropless.Error, match=r"x: shape \[5, 16\], the configuration needs "
                                             r"\[32, 16\]") as e:
        djax.moe_forward(**dict(kw, x=kw["x"][:5]), config=g)
    assert e.value.name == "DL_ESHAPE"
    with pytest.raises(dropless.Error, match="w_down: bfloat16 array") as e:
        djax.moe_forward(**dict(kw, w_down=kw["w_down"].astype(jnp.bfloat16)), config=g)
    assert e.value.name == "DL_EDTYPE"
    with pytest.raises(dropless.Error, match="expert_bias given") as e:
        djax.moe_forward(**kw, expert_bias=jnp.zeros(8), config=g)
    with pytest.raises(dropless.Error, match="the configuration needs w_gate"):
        djax.moe_forward(**dict(kw, w_gate=None), config=dict(g.config))
    with pytest.raises(dropless.Error, match=r"config:\d+: invalid configuration: top_k") as e:
        djax.moe_forward(**kw, config=dict(g.config, top_k=99))
    assert e.value.name == "DL_EINVAL"
    with pytest.raises(dropless.Error, match="unknown key 'topk'"):
        djax.moe_forward(**kw, config={"topk": 2})
    with pytest.raises(dropless.Error, match="not a catalogue case") as e:
        djax.moe_forward(**kw, config="no-such-case")
    # shared experts: refused by name, not computed without them
    with pytest.raises(dropless.Error, match="shared experts .* not supported") as e:
        djax.moe_forward(**kw, config="qwen2-moe-like")
    assert e.value.name == "DL_EINVAL"
    # NaN and infinity: data, found by the library when the program runs
    for name, where in (("x", (3, 2)), ("w_up", (1, 2, 3)), ("router_weight", (0, 0))):
        a = np.array(kw[name])
        a[where] = np.nan if name != "w_up" else np.inf
        with pytest.raises(Exception, match=r"NaN or infinity in an input \(DL_ENONFINITE\)"):
            jax.block_until_ready(fwd(dict(kw, **{name: jnp.asarray(a)}), g))
    d = np.array(jax_inputs(g)["d_out"])
    d[0, 0] = np.nan
    with pytest.raises(Exception, match="dl_moe_backward: NaN or infinity"):
        jax.block_until_ready(djax.moe_backward(**kw, d_out=jnp.asarray(d), config=g))
    # still alive, still exact
    assert_same(fwd(kw, g), g.forward, "after errors")
    g.close()


def test_hash_routing_inputs():
    """Hash routing (deepseek-v4-hash): the table decides the experts, so a
    changed table changes topk_ids and out (the oracle reads it); the
    inputs are refused where missing, misshapen, mistyped or given to a
    configuration without hash routing; an expert id out of range is the
    library's error when the program runs, not a crash."""
    with dropless.generate("deepseek-v4-hash") as g:
        ins = jax_inputs(g)
        kw = layer_args(ins)
        assert kw["token_ids"].dtype == jnp.int32 and kw["hash_table"].shape == (32, 4)
        tab = np.array(kw["hash_table"])
        moved = jnp.asarray((tab + 1) % g.config["experts"])  # every row's experts moved by one
        got = djax.moe_forward(**dict(kw, hash_table=moved), config=g)
        assert np.array_equal(np.asarray(got["topk_ids"]), np.asarray(moved)[np.asarray(kw["token_ids"])])
        assert not np.array_equal(bits(got["out"]), bits(g.forward["out"]))
        # grad through out: no cotangent for the integer inputs, the rest the oracle's
        names = ("x", "router_weight", "w_down")
        loss = lambda *a: jnp.sum(djax.moe_forward(**dict(kw, **dict(zip(names, a))),
                                                   config=g)["out"] * ins["d_out"])
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*[kw[n] for n in names])
        for n, gr in zip(names, grads):
            assert np.array_equal(bits(gr), bits(g.backward["d_" + n])), n
        with pytest.raises(dropless.Error, match="the configuration needs hash_table"):
            djax.moe_forward(**dict(kw, hash_table=None), config=g)
        with pytest.raises(dropless.Error, match=r"hash_table: shape \[32, 3\]") as e:
            djax.moe_forward(**dict(kw, hash_table=kw["hash_table"][:, :3]), config=g)
        assert e.value.name == "DL_ESHAPE"
        with pytest.raises(dropless.Error, match="token_ids: float32 array") as e:
            djax.moe_forward(**dict(kw, token_ids=kw["token_ids"].astype(jnp.float32)), config=g)
        assert e.value.name == "DL_EDTYPE"
        bad = np.array(tab)
        bad[int(np.asarray(kw["token_ids"])[0]), 0] = g.config["experts"]  # no such expert
        with pytest.raises(Exception, match="DL_E"):
            jax.block_until_ready(jax.jit(lambda kw: djax.moe_forward(**kw, config=g))(
                dict(kw, hash_table=jnp.asarray(bad))))
        ht = {n: kw[n] for n in ("token_ids", "hash_table")}
    with dropless.generate("deepseek-v4-like") as g2:
        kw2 = layer_args(jax_inputs(g2))
        # a table given implies hash_vocab (as expert_bias implies has_bias):
        # the library refuses it with this case's selection bias ...
        with pytest.raises(dropless.Error, match="hash routing .* needs has_bias 0"):
            djax.moe_forward(**kw2, **ht, config=g2)
        # ... and a configuration that says hash_vocab = 0 takes none
        with pytest.raises(dropless.Error, match="token_ids given, but .*hash_vocab = 0"):
            djax.moe_forward(**kw2, **ht, config=dict(g2.config, hash_vocab=0))


def test_handler_checks_raw_calls():
    """The target called directly, past the Python checks: the handler
    refuses wrong shapes, types, operand counts and configurations."""
    djax.register()
    x = jnp.zeros((4, 4), jnp.float32)
    cfg = "tokens = 4\nhidden = 4\nexperts = 4\ntop_k = 2"
    res = [jax.ShapeDtypeStruct((4, 4), jnp.float32)]
    cases = [
        ((x, x), cfg, "operand w_gate missing"),
        ((x, x, x, x, x), cfg, "w_gate: shape [4, 4], the configuration needs [4, 4, 4]"),
        ((x.astype(jnp.bfloat16),) * 5, cfg, "x: element type bf16, the configuration needs f32"),
        ((x,), "tokens = 4", "config: missing key 'hidden'"),
    ]
    for ops, text, msg in cases:
        call = jax.ffi.ffi_call(djax.FORWARD, res)
        with pytest.raises(Exception) as e:
            jax.block_until_ready(jax.jit(lambda *a: call(*a, config=text))(*ops))
        assert msg in str(e.value), str(e.value)
    w = jnp.zeros((4, 4, 4), jnp.float32)
    call = jax.ffi.ffi_call(djax.FORWARD, res)
    with pytest.raises(Exception, match="result router_scores missing"):
        jax.block_until_ready(call(x, x, w, w, w, config=cfg))


def test_cotangents_on_other_stages_refused():
    with dropless.generate("tiny") as g:
        kw = layer_args(jax_inputs(g))

        def loss(x):
            return jnp.sum(djax.moe_forward(**dict(kw, x=x), config=g)["router_logits"])
        with pytest.raises(ValueError, match="cotangents on router_logits"):
            jax.grad(loss)(kw["x"])


def test_check_inside_jit():
    """The runner's verdict inside jit: the oracle's own stages PASS, a
    perturbed out FAILs; refusals come at trace time."""
    g = dropless.generate("mixtral-small-bf16")
    kw = layer_args(jax_inputs(g))
    seen = []

    d_out = jax_inputs(g)["d_out"]

    @jax.jit
    def judged(kw, bump):
        st = djax.moe_forward(**kw, config=g)
        st.update(djax.moe_backward(**kw, d_out=d_out, config=g))
        good = djax.check(g, st, profile="bf16", on_report=seen.append)
        bad = djax.check(g, {"out": st["out"] + bump}, profile="bf16")
        return good, bad
    good, bad = judged(kw, jnp.bfloat16(64.0))
    good, bad = np.asarray(good), np.asarray(bad)
    assert good[0] == 1 and good[1] >= 1 and good[3] == 0
    assert bad[0] == 0 and bad[3] >= 1
    assert seen and seen[0].conformant and seen[0].backend == "jax"
    assert {c.stage for c in seen[0].checks if c.verdict == "PASS"} >= set(g.stages())
    r = djax.last_report()
    assert not r.conformant and "out" in r.explain()
    with pytest.raises(dropless.Error) as e:
        jax.jit(lambda o: djax.check(g, {"out": o[:3]}))(kw["x"])
    assert e.value.name == "DL_ESHAPE" and "out" in str(e.value)
    with pytest.raises(dropless.Error) as e:
        jax.jit(lambda o: djax.check(g, {"x": o}))(kw["x"])
    assert e.value.name == "DL_ENOTFOUND"
    g.close()


def _python(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("DROPLESS_JAX_FFI", "CC")}
    e.update(JAX_PLATFORMS="cpu", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=600)


def test_handler_cache_and_prebuilt(tmp_path):
    """Compiled once into the cache; a prebuilt handler (DROPLESS_JAX_FFI)
    needs no compiler."""
    code = ("import dropless.jax as d, jax.numpy as jnp; p = d.register(); "
            "o = d.moe_forward(jnp.ones((2, 4)), jnp.ones((4, 4)), jnp.ones((4, 4, 4)), "
            "jnp.ones((4, 4, 4)), jnp.ones((4, 4, 4)), config={'top_k': 2}); "
            "print(p); print(o['group_sizes'])")
    r = _python(code, DROPLESS_JAX_CACHE=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path = r.stdout.splitlines()[0]
    assert path.startswith(str(tmp_path)) and os.path.isfile(path)
    st = os.stat(path)
    r2 = _python(code, DROPLESS_JAX_CACHE=str(tmp_path))  # a rebuild would replace the file
    assert r2.returncode == 0 and r2.stdout == r.stdout, r2.stderr
    assert (os.stat(path).st_ino, os.stat(path).st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    r3 = _python(code, DROPLESS_JAX_CACHE=str(tmp_path / "empty"), CC="false", DROPLESS_JAX_FFI=path)
    assert r3.returncode == 0 and r3.stdout.splitlines()[0] == path, r3.stderr
    r4 = _python(code, DROPLESS_JAX_CACHE=str(tmp_path / "empty"), CC="false")
    assert r4.returncode != 0 and "compiling the FFI handler failed" in r4.stderr
    r5 = _python(code, DROPLESS_JAX_FFI=str(tmp_path / "nothing.so"))
    assert r5.returncode != 0 and "cannot load the FFI handler" in r5.stderr


def test_bundle_runs_without_a_compiler(tmp_path):
    """tools/bundle_libs.sh: the library, what it needs and a prebuilt
    handler in one directory, enough to run the oracle with no compiler."""
    b = tmp_path / "bundle"
    r = subprocess.run(["sh", os.path.join(SRC, "tools", "bundle_libs.sh"), str(b)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, DROPLESS_PYTHON=sys.executable))
    assert r.returncode == 0, r.stderr
    assert (b / "libdropless.so.0").is_file() and (b / "libdropless_jax_ffi.so").is_file()
    code = ("import dropless.jax as d, jax.numpy as jnp; print(d.handler_path()); "
            "o = d.moe_forward(jnp.ones((2, 4)), jnp.ones((4, 4)), jnp.ones((4, 4, 4)), "
            "jnp.ones((4, 4, 4)), jnp.ones((4, 4, 4)), config={'top_k': 2}); "
            "print(o['group_sizes'])")
    r = _python(code, LD_LIBRARY_PATH=str(b), DROPLESS_LIB=str(b / "libdropless.so.0"),
                DROPLESS_JAX_FFI=str(b / "libdropless_jax_ffi.so"), CC="false",
                DROPLESS_JAX_CACHE=str(tmp_path / "none"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [str(b / "libdropless_jax_ffi.so"), "[2 2 0 0]"]


def test_import_error_without_jax():
    r = _python("import sys; sys.modules['jax'] = None\nimport dropless\n"
                "try:\n    import dropless.jax\nexcept ImportError as e:\n    print('ImportError:', e)")
    assert r.returncode == 0 and "ImportError: dropless.jax needs JAX" in r.stdout, r.stderr


@pytest.mark.parametrize("case", ["mixtral-small-bf16", "deepseek-v3-small"])
def test_example_runs(case):
    """examples/jax_moe_ffi.py: a ragged_dot layer checked against the oracle
    under jit, forward and grad: conformant as written, not with its defect."""
    ex = os.path.join(SRC, "examples", "jax_moe_ffi.py")
    r = subprocess.run([sys.executable, ex, "--case", case], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dropless check: case " + case in r.stdout
    assert "\nconformant: forward PASS, backward PASS" in r.stdout
    assert "bit-identical to the golden: forward True, grad d_x True" in r.stdout
    r = subprocess.run([sys.executable, ex, "--case", case, "--defect", "renormalize"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "NOT conformant" in r.stdout, r.stdout + r.stderr
    assert "topk_weights numerics FAIL" in r.stdout


def _ffi_minor():
    import re
    with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
        return int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", f.read()).group(1))


def test_ffi_version_handshake():
    """The handler's answers to XLA's version handshake, called as XLA calls
    it (a call frame built here, over a stand-in API whose error_create
    records the message): the metadata query gets the header's version; a
    metadata struct older than the header, a call frame of another major
    version or an older layout are refused, not read."""
    import ctypes as C

    class Ver(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("major", C.c_int),
                    ("minor", C.c_int)]

    class ExtBase(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", C.c_void_p)]

    class Meta(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("api_version", Ver), ("traits", C.c_uint32),
                    ("state_type_id", C.c_int64)]

    class MetaExt(C.Structure):
        _fields_ = [("base", ExtBase), ("metadata", C.POINTER(Meta))]

    class ErrArgs(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("message", C.c_char_p),
                    ("errc", C.c_int)]
    create_t = C.CFUNCTYPE(C.c_void_p, C.POINTER(ErrArgs))

    class Api(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("api_version", Ver),
                    ("internal", C.c_void_p), ("error_create", create_t)] + \
                   [("fn%d" % i, C.c_void_p) for i in range(17)]

    class Seq(C.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64),
                    ("types", C.c_void_p), ("items", C.c_void_p)]

    class Attrs(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64),
                    ("types", C.c_void_p), ("names", C.c_void_p), ("attrs", C.c_void_p)]

    class Frame(C.Structure):
        _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("api", C.POINTER(Api)),
                    ("ctx", C.c_void_p), ("stage", C.c_int), ("args", Seq), ("rets", Seq),
                    ("attrs", Attrs), ("future", C.c_void_p)]
    frame_size = Frame.future.offset  # XLA_FFI_CallFrame_STRUCT_SIZE: up to attrs
    meta_size = Meta.traits.offset + C.sizeof(C.c_uint32)
    messages = []

    def create(args):
        messages.append(args.contents.message.decode())
        return 0x1000 + len(messages)  # an opaque error for the handler to return
    cb = create_t(create)
    djax.register()
    h = C.CDLL(djax.handler_path())
    h.dl_jax_moe_forward.restype = C.c_void_p
    h.dl_jax_moe_forward.argtypes = [C.POINTER(Frame)]
    api = Api(struct_size=C.sizeof(Api), api_version=Ver(C.sizeof(Ver), None, 0, _ffi_minor()),
              error_create=cb)

    def call(frame_size=frame_size, major=0, ext=None):
        api.api_version.major = major
        f = Frame(struct_size=frame_size, ext=C.cast(C.pointer(ext), C.c_void_p) if ext else None,
                  api=C.pointer(api), stage=3)
        return h.dl_jax_moe_forward(C.byref(f))

    meta = Meta(struct_size=meta_size)
    ext = MetaExt(ExtBase(C.sizeof(MetaExt), 1, None), C.pointer(meta))
    assert call(ext=ext) is None and not messages
    assert (meta.api_version.major, meta.api_version.minor) == (0, _ffi_minor())
    assert meta.api_version.struct_size == C.sizeof(Ver) and meta.traits == 0
    meta.struct_size = meta_size - 4
    assert call(ext=ext) and "metadata structs are older" in messages[-1]
    assert call(major=1) and "XLA FFI API 1.%d" % _ffi_minor() in messages[-1]
    assert "built for 0.%d" % _ffi_minor() in messages[-1]
    assert call(frame_size=frame_size - 8) and "rebuild it against this jaxlib" in messages[-1]
    assert call() and "no attribute config" in messages[-1]  # a well-formed frame is read


def test_x64_keeps_int64_stages():
    """With jax_enable_x64 the int64 stages are int64 (without it int32, as
    JAX has no int64 then); the same values."""
    code = ("import numpy as np, jax, jax.numpy as jnp, dropless; from dropless import jax as d\n"
            "g = dropless.generate('deepseek-v3-small-bf16')\n"
            "ins = {k: jnp.asarray(v) for k, v in g.inputs.as_storage('ml_dtypes').items()}\n"
            "ins.pop('d_out')\n"
            "o = jax.jit(lambda i: d.moe_forward(**i, config=g))(ins)\n"
            "print(o['group_sizes'].dtype, o['group_offsets'].dtype, all(np.array_equal("
            "np.asarray(o[n]).astype(g.forward[n].dtype), g.forward[n]) for n in o))")
    r = _python(code, JAX_ENABLE_X64="1")
    assert r.returncode == 0 and r.stdout.split() == ["int64", "int64", "True"], r.stdout + r.stderr
