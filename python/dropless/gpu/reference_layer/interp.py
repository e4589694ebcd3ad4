"""Triton's CPU interpreter (TRITON_INTERPRET=1) for the tests of the
Triton kernels on a machine without a GPU. Triton 3.6's interpreter turns a
scalar (a one-element array) into a Python int with int(array), which
numpy >= 2.4 refuses for arrays of one dimension; patched here to take the
element. Import before launching a kernel; changes nothing on a GPU run
(the interpreter is not used there)."""

import os


def enable():
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from triton.runtime import interpreter
    orig = interpreter._patch_lang_tensor
    if getattr(orig, "_dl_patched", False):
        return True

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    patched._dl_patched = True
    interpreter._patch_lang_tensor = patched
    return True
