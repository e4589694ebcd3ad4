"""Strict arguments: what crosses into the C library is checked here, so
nothing is silently wrapped, truncated or aliased on the way (a seed of
2**64 + 7 is not 7, 'out\\0zzz' is not 'out', 'g.h5\\0junk' is not 'g.h5')."""

import operator
import os

SEED_MAX = 2 ** 64 - 1
# The limit on the child process that parses an untrusted file first (the
# CLI's preflight, dl_golden_load_isolated); DROPLESS_PREFLIGHT_SECONDS
# overrides it, as for the CLI.
PREFLIGHT_SECONDS = 120


def seed(value):
    """value as a seed (an integer in [0, 2**64 - 1]; numpy integers too),
    or ValueError; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("seed %r: a seed is an integer, not a bool" % (value,))
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError("seed %r: a seed is an integer (got %s)" % (value, type(value).__name__)) \
            from None
    if not 0 <= v <= SEED_MAX:
        raise ValueError("seed %d: out of range (0 to 2**64 - 1)" % v)
    return v


def text(value, what):
    """value (str) as bytes for the library, or ValueError when it holds a
    NUL (C would stop there); TypeError for a non-string."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    if "\0" in value:
        raise ValueError("%s %r holds a NUL byte" % (what, value))
    return value.encode()


def path(value, what="path"):
    """A path (str, bytes or os.PathLike) as bytes, or ValueError when it
    holds a NUL byte."""
    try:
        p = os.fsencode(os.fspath(value))
    except TypeError:
        raise TypeError("%s must be a str, bytes or os.PathLike, not %s"
                        % (what, type(value).__name__)) from None
    if b"\0" in p:
        raise ValueError("%s %r holds a NUL byte" % (what, value))
    if not p:
        raise ValueError("%s is empty" % what)
    return p


def timeout(value):
    """The preflight limit in whole seconds (None: DROPLESS_PREFLIGHT_SECONDS,
    else 120); 0 means none. ValueError for a negative or non-number."""
    if value is None:
        env = os.environ.get("DROPLESS_PREFLIGHT_SECONDS", "")
        return int(env) if env.isdigit() and 0 < int(env) < 86400 else PREFLIGHT_SECONDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValueError("timeout %r: a number of seconds >= 0 (0: no limit)" % (value,))
    if value == 0:
        return 0
    return max(1, min(int(-(-value // 1)), 86399))  # whole seconds, rounded up
