"""The pytest plugin (entry point pytest11 "dropless"):

    --dropless-cases=SPEC                the cases dropless_golden runs over
    dropless_golden                      a parametrised fixture: one Golden per case
    dropless_golden_dtype                one Golden per storage type of one case
    @pytest.mark.dropless_cases(FILTERS) narrows the cases for one test
    JUnit properties                     every assert_conformant records its report's figures

SPEC is BASE[:FILTERS]. BASE is a comma-separated list of catalogue names,
case files, 'small' (the catalogue's vectors tier: the small cases
committed under vectors/, every dtype) and 'kernel' (its kernel tier: the
shapes at which GPU grouped GEMMs tile, pad and split K; larger: see each
case's memory_bytes). FILTERS is a comma-separated list of words, each a
storage type (fp32, bf16, fp16), an FFN kind (swiglu, plain) or a score
function (softmax, sigmoid): a case is kept when it matches one word of
each kind named ("small:bf16,swiglu": the small bf16 SwiGLU cases). The
marker takes FILTERS (or a whole SPEC) and keeps, of the command line's
cases, those it matches: a SwiGLU kernel marks its test "swiglu" and never
meets plain-ffn. Goldens are made in memory once per session and shared:
a test's close() or `with` leaves them open for the next. The library is
loaded only when a test asks.
"""

import pytest

from . import testing

_goldens = {}
# the catalogue's fields each filter word can match
FILTER_FIELDS = ("dtype", "ffn_kind", "score_function")


def pytest_addoption(parser):
    g = parser.getgroup("dropless", "dropless golden cases")
    g.addoption("--dropless-cases", default="small", metavar="BASE[:FILTERS]",
                help="cases for the dropless_golden fixture: comma-separated catalogue names or "
                     "case files, 'small' (the vectors tier, default) or 'kernel' (the kernel "
                     "tier), then optionally ':' and filter words (fp32, bf16, fp16, swiglu, "
                     "plain, swiglu-clamp, geglu-tanh, relu2, softmax, sigmoid), e.g. small:bf16,swiglu")
    g.addoption("--dropless-dtype-case", default="mixtral-small", metavar="NAME",
                help="the case dropless_golden_dtype gives in each storage type (NAME, "
                     "NAME-bf16, NAME-fp16)")


def pytest_configure(config):
    config.addinivalue_line("markers", "dropless_cases(filters): the dropless_golden cases this "
                                       "test takes, among --dropless-cases (e.g. 'swiglu,bf16')")


def _words(catalogue):
    """{filter word: catalogue field} over the catalogue's values."""
    return {str(c.config[f]): f for c in catalogue for f in FILTER_FIELDS}


def _matches(config, filters, words):
    kinds = {}
    for w in filters:
        kinds.setdefault(words[w], set()).add(w)
    return all(str(config[f]) in ws for f, ws in kinds.items())


def case_names(spec):
    """The case names a --dropless-cases value (BASE[:FILTERS]) stands
    for; raises pytest.UsageError for an unknown filter word."""
    from .golden import cases
    catalogue = cases()
    by_name = {c.name: c for c in catalogue}
    base, _, filt = spec.partition(":")
    filters = [w.strip() for w in filt.split(",") if w.strip()]
    words = _words(catalogue)
    unknown = [w for w in filters if w not in words]
    if unknown:
        raise pytest.UsageError("--dropless-cases: unknown filter %s (known: %s)"
                                % (", ".join(unknown), ", ".join(sorted(words))))
    out = []
    for part in (p.strip() for p in base.split(",")):
        if part in ("small", "kernel"):
            tier = "vectors" if part == "small" else "kernel"
            out += [c.name for c in catalogue if c.tier == tier]
        elif part:
            out.append(part)
    # case files are not in the catalogue: the filters cannot see them, so they stay
    keep = [n for n in out if n not in by_name or _matches(by_name[n].config, filters, words)]
    return list(dict.fromkeys(keep))


def _marked(metafunc, names):
    """names narrowed by the test's dropless_cases markers: their filter
    words as in --dropless-cases, any other word a case name to keep."""
    from .golden import cases
    catalogue = {c.name: c for c in cases()}
    words = _words(catalogue.values())
    for m in metafunc.definition.iter_markers("dropless_cases"):
        args = [w.strip() for a in m.args for w in str(a).split(",") if w.strip()]
        filters = [w for w in args if w in words]
        named = [w for w in args if w not in words]
        names = [n for n in names if (not named or n in named) and
                 (n not in catalogue or _matches(catalogue[n].config, filters, words))]
    return names


def pytest_generate_tests(metafunc):
    if "dropless_golden" in metafunc.fixturenames:
        names = _marked(metafunc, case_names(metafunc.config.getoption("dropless_cases")))
        metafunc.parametrize("dropless_golden", names, indirect=True, ids=names)
    if "dropless_golden_dtype" in metafunc.fixturenames:
        from .golden import cases
        base = metafunc.config.getoption("dropless_dtype_case")
        known = {c.name for c in cases()}
        variants = [(dt, base if dt == "fp32" else "%s-%s" % (base, dt)) for dt in ("fp32", "bf16", "fp16")]
        variants = [(dt, n) for dt, n in variants if n in known]
        if not variants:
            raise pytest.UsageError("--dropless-dtype-case: %s has no fp32/bf16/fp16 variants in "
                                    "the catalogue" % base)
        metafunc.parametrize("dropless_golden_dtype", [n for _, n in variants], indirect=True,
                             ids=[dt for dt, _ in variants])


def _shared(name):
    from .golden import generate
    if name not in _goldens:
        _goldens[name] = generate(name)._share()
    return _goldens[name]


@pytest.fixture
def dropless_golden(request):
    """A golden case (dropless.Golden), one per --dropless-cases entry;
    shared by the session (close() leaves it open)."""
    return _shared(getattr(request, "param", None) or "mixtral-small")


@pytest.fixture
def dropless_golden_dtype(request):
    """One case (--dropless-dtype-case, default mixtral-small) in each
    storage type: ids fp32, bf16, fp16; shared like dropless_golden."""
    return _shared(request.param)


def _properties(item):
    def record(report):
        worst = max((c.err_pass for c in report.checks if c.get("err_pass") is not None),
                    default=None)
        pre = "dropless"
        item.user_properties.extend([
            (pre + ".case", report.case), (pre + ".backend", report.backend),
            (pre + ".profile", report.profile), (pre + ".verdict", report.verdict),
            (pre + ".pass", report.counts.get("PASS", 0)), (pre + ".warn", report.counts.get("WARN", 0)),
            (pre + ".fail", report.counts.get("FAIL", 0)), (pre + ".dropped", report.n_dropped),
            (pre + ".worst_err_pass", worst)])
    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    testing._record = _properties(item)
    try:
        yield
    finally:
        testing._record = None


def pytest_sessionfinish(session):
    for g in _goldens.values():
        g._free()
    _goldens.clear()
