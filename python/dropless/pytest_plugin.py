"""The pytest plugin (entry point pytest11 "dropless"):

    --dropless-cases=NAMES|small|kernel   the cases dropless_golden runs over
    dropless_golden                      a parametrised fixture: one Golden per case
    JUnit properties                     every assert_conformant records its report's figures

NAMES is a comma-separated list of catalogue names (or case files); small
is the catalogue's vectors tier (the small cases committed under vectors/,
every dtype); kernel its kernel tier (the shapes at which GPU grouped GEMMs
tile, pad and split K; larger: see each case's memory_bytes). Goldens are
made in memory once per session. The library is loaded only when a test
asks.
"""

import pytest

from . import testing

_goldens = {}


def pytest_addoption(parser):
    g = parser.getgroup("dropless", "dropless golden cases")
    g.addoption("--dropless-cases", default="small", metavar="NAMES|small|kernel",
                help="cases for the dropless_golden fixture: comma-separated catalogue names or "
                     "case files, 'small' (the vectors tier, default) or 'kernel' (the kernel "
                     "tier)")


def case_names(spec):
    """The case names a --dropless-cases value stands for."""
    from .golden import cases
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in ("small", "kernel"):
            tier = "vectors" if part == "small" else "kernel"
            out += [c.name for c in cases() if c.tier == tier]
        else:
            out.append(part)
    return list(dict.fromkeys(out))


def pytest_generate_tests(metafunc):
    if "dropless_golden" in metafunc.fixturenames:
        names = case_names(metafunc.config.getoption("dropless_cases"))
        metafunc.parametrize("dropless_golden", names, indirect=True, ids=names)


@pytest.fixture
def dropless_golden(request):
    """A golden case (dropless.Golden), one per --dropless-cases entry."""
    from .golden import generate
    name = getattr(request, "param", None) or "mixtral-small"
    if name not in _goldens:
        _goldens[name] = generate(name)
    return _goldens[name]


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
        g.close()
    _goldens.clear()
