"""dropless: golden MoE cases and the conformance check of libdropless.

    import dropless
    g = dropless.generate("mixtral-small")          # in memory
    report = dropless.check(g, {"out": my_out, "d_x": my_dx})
    dropless.testing.assert_conformant(g, outputs)

The C library does all the work (generation, loading, every check); this
package converts arrays and wraps errors as dropless.Error. See doc/python.md.
"""

from ._lib import Error
from .golden import Golden, cases, generate, layout, load, memory, progress_bar, stage_names
from .check import Report, check, write_candidate
from . import testing
from . import layouts
from .mutate import mutant_check, mutate
from ._arrays import to_numpy

__version__ = "0.1.0"

__all__ = ["Error", "Golden", "Report", "cases", "check", "generate", "layout", "load",
           "stage_names", "testing", "layouts", "mutate", "mutant_check", "to_numpy", "write_candidate",
           "library_path", "memory", "progress_bar"]


def library_path():
    """The path of the libdropless in use (loads it)."""
    from ._lib import lib
    return lib().dropless_path
