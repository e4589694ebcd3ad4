"""Arrays from any framework to host numpy arrays the library takes, and
golden arrays to the framework types people ask for. Conversions here are
exact copies only: no value is rounded or recomputed (the library refuses
what it cannot hold exactly, and judges everything else)."""

import numpy as np

from . import _lib

# dl_api_elem_t of api.h
F32, F64, BF16, F16, I32, I64 = range(6)


def _bf16_dtype():
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # a declared dependency; bf16 from torch still works without it
        return None


def _from_torch(t):
    import torch
    t = t.detach()
    if t.is_sparse:
        t = t.to_dense()
    t = t.cpu().contiguous()  # a device-to-host copy is exact
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), BF16
    if t.is_complex() or t.dtype == torch.bool:
        return t.numpy(), None
    return t.numpy(), None


def _from_dlpack(x):
    try:
        return np.from_dlpack(x)
    except (TypeError, RuntimeError, BufferError, ValueError):
        pass
    try:  # a device array: ask the producer for a host copy (DLPack >= 1.0)
        return np.from_dlpack(x, device="cpu", copy=True)
    except (TypeError, RuntimeError, BufferError, ValueError, AttributeError):
        pass
    if hasattr(x, "get"):  # CuPy's device-to-host copy
        return np.asarray(x.get())
    raise TypeError("cannot bring %s to the host through DLPack" % type(x).__name__)


def to_host(x):
    """(numpy array, element code or None) for any array-like: numpy, torch
    (CPU or CUDA), JAX, CuPy, anything with __dlpack__ or __array__."""
    code = None
    if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach"):
        a, code = _from_torch(x)
    elif isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__array__"):
        try:
            a = np.asarray(x)
        except (TypeError, RuntimeError, ValueError):
            if not hasattr(x, "__dlpack__"):
                raise
            a = _from_dlpack(x)
    elif hasattr(x, "__dlpack__"):
        a = _from_dlpack(x)
    elif isinstance(x, (list, tuple)):
        a = np.asarray(x)
    else:
        raise TypeError("%s is not an array (no __array__ or __dlpack__)" % type(x).__name__)
    return a, code


def element_code(a):
    """The library's element code for numpy array a, and the array to pass
    (contiguous, native byte order, 16-bit floats as their bit patterns);
    (None, reason) for a type the library does not take."""
    dt = a.dtype
    if dt.byteorder not in ("=", "|") and dt.kind in "fiu":
        a = a.astype(dt.newbyteorder("="))
        dt = a.dtype
    bf16 = _bf16_dtype()
    if bf16 is not None and dt == bf16:
        return BF16, np.ascontiguousarray(a).view(np.uint16)
    if dt == np.float16:
        return F16, np.ascontiguousarray(a).view(np.uint16)
    if dt == np.float32:
        return F32, np.ascontiguousarray(a)
    if dt == np.float64:
        return F64, np.ascontiguousarray(a)
    if dt == np.int32:
        return I32, np.ascontiguousarray(a)
    if dt == np.int64:
        return I64, np.ascontiguousarray(a)
    if dt.kind in "iu" and dt != np.uint64:
        return I64, np.ascontiguousarray(a, dtype=np.int64)  # every value fits exactly
    if dt == np.uint64:
        if a.size and int(a.max()) > np.iinfo(np.int64).max:
            return None, "uint64 values above int64's range"
        return I64, np.ascontiguousarray(a, dtype=np.int64)
    return None, "%s array" % dt


def prepare(name, x):
    """(code, contiguous numpy array) for stage `name`, or raises Error
    (DL_EDTYPE) naming the stage."""
    try:
        a, code = to_host(x)
    except TypeError as e:
        raise _lib.error("DL_EDTYPE", "%s: %s" % (name, e)) from None
    if code is not None:
        return code, np.ascontiguousarray(a)
    code, arr = element_code(np.asarray(a))
    if code is None:
        raise _lib.error("DL_EDTYPE", "%s: %s: dropless takes fp32, bf16, fp16, fp64 or integer arrays"
                         % (name, arr))
    return code, arr


def to_numpy(x):
    """Any array-like as a host numpy array, exactly: bf16 as
    ml_dtypes.bfloat16, everything else in its own dtype."""
    a, code = to_host(x)
    if code == BF16:
        bf16 = _bf16_dtype()
        if bf16 is None:
            raise _lib.error("DL_EDTYPE", "bf16 arrays need ml_dtypes")
        return np.asarray(a).view(bf16)
    return np.asarray(a)


def as_storage(a, dtype, kind, device=None):
    """Golden array a (float32 holding exact values, or integers) in its
    storage type dtype, as `kind`: "numpy" (float32 as stored), "ml_dtypes"
    (bf16/fp16 arrays of ml_dtypes / numpy), "torch" (a tensor of the
    storage dtype, on device)."""
    if kind == "numpy":
        return a
    if kind == "ml_dtypes":
        if dtype == "bf16":
            return a.astype(_bf16_dtype())
        if dtype == "fp16":
            return a.astype(np.float16)
        return a
    if kind == "torch":
        import torch
        t = torch.from_numpy(np.array(a))
        if dtype in ("bf16", "fp16"):
            t = t.to(torch.bfloat16 if dtype == "bf16" else torch.float16)  # exact: values on the grid
        return t.to(device) if device is not None else t
    raise ValueError("unknown array kind %r (numpy, ml_dtypes, torch)" % kind)
