"""Assertions for kernel tests, in the spirit of torch.testing.assert_close."""

from .check import check

# Set by the pytest plugin around each test: figures of every report go to
# the test's JUnit properties.
_record = None


def assert_conformant(golden, outputs, **kw):
    """Checks outputs against golden (dropless.check's arguments) and raises
    AssertionError when the report is not conformant; the message lists the
    failing rows with their worst elements and any dropped tokens. Returns
    the Report."""
    r = check(golden, outputs, **kw)
    if _record is not None:
        _record(r)
    if not r.conformant:
        raise AssertionError(r.explain())
    return r
