"""The one declaration of each C function the kernels' library exports: the build writes `signatures.h` from this
table (the .cpp files include it, so the compiler refuses a definition that differs), the ctypes argument lists are
made from it, and its hash, compiled into the library (`attn_signature`), is checked when a library is loaded, so
that one built from other declarations is refused instead of being called with the wrong arguments."""
from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One exported C function: its name, return type and arguments, each "C type name" (a pointer's star on the
    type: "const float* scores")."""
    name: str
    returns: str
    args: tuple[str, ...] = ()

    def declaration(self) -> str:
        return f"{self.returns} {self.name}({', '.join(self.args) or 'void'});"

    def types(self) -> list[str]:
        return [arg.rsplit(" ", 1)[0] for arg in self.args]


def _typed(name: str, returns: str, args: str) -> tuple[Kernel, Kernel]:
    """The float32 and float64 kernels of one template: `{F}` the float type, `{K}` the unsigned key of its width."""
    return tuple(Kernel(f"{name}_{suffix}", returns, tuple(a.strip().format(F=f, K=key) for a in args.split(",")))
                 for suffix, f, key in (("f32", "float", "uint32_t"), ("f64", "double", "uint64_t")))  # type: ignore


SELECT = _typed("attn_select", "void", "const {F}* scores, int64_t rows, int64_t m, int64_t kk, int64_t threads, "
                                       "{K}* scratch, int64_t* idx, bool* use")
SELECTED_SOFTMAX = _typed(
    "attn_selected_softmax", "void",
    "const {F}* q, int64_t q_batch, int64_t q_head, const {F}* k, int64_t k_batch, int64_t k_head, const {F}* v, "
    "int64_t v_batch, int64_t v_head, const int64_t* idx, const bool* ok, int64_t B, int64_t H, int64_t r, "
    "int64_t D, int64_t Hk, int64_t S, int64_t kk, int64_t m, int64_t width, {F} scale, const {F}* sinks, "
    "int64_t threads, {F}* scratch, {F}* state, int64_t* bounds, {F}* out")
BLOCK_SOFTMAX = _typed(
    "attn_block_softmax", "void",
    "const {F}* q, int64_t q_batch, int64_t q_head, const {F}* k, int64_t k_batch, int64_t k_head, const {F}* v, "
    "int64_t v_batch, int64_t v_head, const int64_t* sel, int64_t B, int64_t H, int64_t r, int64_t D, int64_t Hk, "
    "int64_t S, int64_t nb, int64_t m, int64_t l, int64_t first, int64_t tile, {F} scale, const {F}* sinks, "
    "int64_t threads, {F}* scratch, int64_t* lists, {F}* out")
def _listed(name: str, returns: str, args: str) -> Kernel:
    """One kernel, its arguments written as one C parameter list."""
    return Kernel(name, returns, tuple(a.strip() for a in args.split(",")))


INDEX = _listed("attn_index_scores_f32", "void",
                "const float* qi, int64_t qb, const float* kT, int64_t kb, int64_t ks, const float* w, int64_t B, "
                "int64_t r, int64_t m, int64_t IH, int64_t dI, int64_t threads, float* out")
ELU_PLUS_ONE = _listed("attn_elu_plus_one_f32", "void",
                       "const float* x, int64_t rows, int64_t x_row, int64_t width, int64_t out_row, int64_t threads, "
                       "float* out")
PREFIX = _typed("attn_prefix", "void", "const {F}* x, int64_t outer, int64_t steps, int64_t inner, int64_t threads, "
                                      "{F}* out")
BAND = _listed("attn_band_f32", "void",
               "const float* q, int64_t q_batch, int64_t q_head, const float* k, int64_t k_batch, int64_t k_head, "
               "const float* v, int64_t v_batch, int64_t v_head, const float* bt, int64_t B, int64_t H, int64_t Hk, "
               "int64_t n, int64_t D, int64_t block, int64_t left, int64_t span, int64_t bp, float scale, "
               "int64_t threads, float* scratch, float* out")
_STRIDED = ("const float* q, int64_t q_batch, int64_t q_head, int64_t q_row, const float* k, int64_t k_batch, "
            "int64_t k_head, int64_t k_row, const float* v, int64_t v_batch, int64_t v_head, int64_t v_row")
LINEAR = _listed("attn_linear_f32", "int64_t", _STRIDED + ", int64_t B, int64_t H, int64_t Hk, int64_t nq, int64_t nk, "
                 "int64_t D, int64_t parts, int64_t stream, int64_t threads, float* scratch, float* out")
LINEAR_CAUSAL = _listed("attn_linear_causal_f32", "int64_t", _STRIDED + ", int64_t B, int64_t H, int64_t Hk, "
                        "int64_t n, int64_t D, int64_t stream, int64_t threads, float* scratch, float* out")
LINEAR_AVAILABLE = Kernel("attn_linear_available", "int64_t")
KERNELS = (*SELECT, *SELECTED_SOFTMAX, *BLOCK_SOFTMAX, INDEX, ELU_PLUS_ONE, *PREFIX, BAND, LINEAR, LINEAR_CAUSAL,
           Kernel("attn_select_openmp", "int64_t"), Kernel("attn_index_available", "int64_t"),
           Kernel("attn_elu_plus_one_available", "int64_t"), Kernel("attn_band_available", "int64_t"),
           LINEAR_AVAILABLE)
SIGNATURE_FUNCTION = "attn_signature"  # const char*: the hash of the declarations the library was built from

_CTYPES = {"void": None, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "double": ctypes.c_double,
           "const char*": ctypes.c_char_p}


def ctype(c: str):
    """The ctypes type that passes a C type: any data pointer as c_void_p (a tensor's data_ptr)."""
    if c in _CTYPES:
        return _CTYPES[c]
    if c.endswith("*"):
        return ctypes.c_void_p
    raise ValueError(f"no ctypes type for the C type {c!r}: add it to signatures._CTYPES")


def declarations(kernels: tuple[Kernel, ...] | None = None) -> str:
    return "\n".join(k.declaration() for k in (KERNELS if kernels is None else kernels))


def signature(kernels: tuple[Kernel, ...] | None = None) -> str:
    """The hash a library built from these declarations returns from `attn_signature`."""
    return hashlib.sha256(declarations(kernels).encode()).hexdigest()[:24]


def header(kernels: tuple[Kernel, ...] | None = None) -> str:
    """signatures.h: every kernel's declaration, extern "C"."""
    return ("// Generated from attn_core/native/signatures.py at each build; edit the table there, not this file.\n"
            "#pragma once\n#include <cstdint>\n\nextern \"C\" {\n" + declarations(kernels)
            + f"\nconst char* {SIGNATURE_FUNCTION}(void);\n}}\n")


def signature_source(kernels: tuple[Kernel, ...] | None = None) -> str:
    """signature.cpp: `attn_signature`, returning the table's hash."""
    return (f'#include "signatures.h"\n\nextern "C" const char* {SIGNATURE_FUNCTION}(void) '
            f'{{ return "{signature(kernels)}"; }}\n')


def bind(lib: ctypes.CDLL, kernels: tuple[Kernel, ...] | None = None) -> None:
    """Each kernel's ctypes return and argument types set from its declaration (ctypes then checks the count)."""
    for k in KERNELS if kernels is None else kernels:
        fn = getattr(lib, k.name)
        fn.restype = ctype(k.returns)
        fn.argtypes = [ctype(t) for t in k.types()]
