"""The C++ kernels as torch operators (attn_lab::select, selected_softmax, block_softmax, index_scores, elu_plus_one,
prefix_sums, band, linear): torch.library.opcheck on each, torch.compile tracing around them, a backward through one
refused with a sentence; and their one declaration (attn_core/native/signatures.py): a definition that differs is
refused by the compiler, a library built from other declarations is refused at load and built again, its new file
loaded by a new handle."""
from __future__ import annotations

import shutil

import pytest
import torch

from attn_core import native
from attn_core.native import loader, signatures, toolchain
from tests.native.test_native import built, stable_top  # noqa: F401  (built: the fixture)


def op_samples():
    """(op, arguments) for each kernel: views read in place, unusable keys, one selection per key/value head."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 300, generator=g)
    q = torch.randn(1, 4, 5, 16, generator=g)
    k = torch.randn(1, 2, 45, 16, generator=g)[:, :, 2:42]  # a view: rows in place, offset
    v = torch.randn(1, 2, 40, 16, generator=g)
    idx = torch.randint(0, 40, (1, 2, 5, 7), generator=g).sort(-1).values
    usable = torch.rand(1, 2, 5, 7, generator=g) < 0.8
    samples = [(torch.ops.attn_lab.select.default, (scores, 40)),
               (torch.ops.attn_lab.select.default, (scores.double(), 1)),
               (torch.ops.attn_lab.selected_softmax.default, (q, k, v, idx, usable, 0)),
               (torch.ops.attn_lab.selected_softmax.default, (q.double(), k.double(), v.double(), idx, usable, 0)),
               (torch.ops.attn_lab.block_softmax.default, (q, k, v, idx // 8, 8, 30, None)),
               (torch.ops.attn_lab.block_softmax.default, (q.double(), k.double(), v.double(), idx[:, :1] // 8, 8, 0,
                                                           torch.randn(4, generator=g, dtype=torch.float64)))]
    if native.index_runs(q):
        qi = torch.randn(2, 9, 4 * 8, generator=g)[:, 1:]
        kt = torch.randn(2, 8, 50, generator=g)[:, :, :47]
        samples.append((torch.ops.attn_lab.index_scores.default, (qi, kt, torch.rand(4, generator=g))))
    qb, kb = torch.randn(1, 4, 70, 16, generator=g), torch.randn(1, 2, 70, 16, generator=g)
    if native.band_runs(qb, kb, kb):  # blocks of 16 rows (the last of 6), each against 16 keys back and its own 16
        bias_t = torch.zeros(32, native.band_rows(16))
        samples.append((torch.ops.attn_lab.band.default, (qb, kb, torch.randn(1, 2, 70, 16, generator=g), bias_t,
                                                          torch.zeros(1, 4, 70, 16), 16, 16)))
    if native.linear_runs(qb, kb, kb):  # 70 queries of 4 heads against 30 keys of 2 shared heads
        kl = torch.randn(1, 30, 2 * 16, generator=g).view(1, 30, 2, 16).transpose(1, 2)  # heads split, in place
        vl = torch.randn(1, 2, 30, 16, generator=g)
        scratch = torch.empty(native.linear_scratch_bytes(2, 4, 70, 30, 16) // 4)
        samples.append((torch.ops.attn_lab.linear.default, (qb, kl, vl, scratch, torch.zeros(1, 4, 70, 16), False)))
        scratch = torch.empty(native.linear_scratch_bytes(2, 4, 70, 70, 16, causal=True) // 4)  # a block and 6
        samples.append((torch.ops.attn_lab.linear.default, (qb, kb, torch.randn(1, 2, 70, 16, generator=g), scratch,
                                                            torch.zeros(1, 4, 70, 16), True)))
    x = torch.randn(3, 37, generator=g)
    if native.elu_runs(x, x):
        samples.append((torch.ops.attn_lab.elu_plus_one.default, (x, torch.empty_like(x))))
        heads = torch.randn(2, 3, 40, 8, generator=g)
        samples.append((torch.ops.attn_lab.elu_plus_one.default, (heads[:, :, 5:20], torch.empty(2, 3, 15, 8))))
    samples += [(torch.ops.attn_lab.prefix_sums.default, (torch.randn(2, 9, 1500, generator=g),)),
                (torch.ops.attn_lab.prefix_sums.default, (torch.randn(3, 1, 4, generator=g, dtype=torch.float64),))]
    return samples


@pytest.mark.usefixtures("built")
def test_opcheck_passes_on_every_kernel():
    """torch.library.opcheck (schema, autograd registration, the fake implementation's shapes against the real
    outputs, AOT dispatch with dynamic shapes) on each op; the indexer and the feature map where the library has them
    (AVX-512 or AVX2)."""
    for op, args in op_samples():
        torch.library.opcheck(op, args)


@pytest.mark.usefixtures("built")
def test_torch_compile_traces_around_the_kernels():
    """A function that selects with the C++ kernel and attends over the selection compiles in one graph (fullgraph:
    the ops are opaque nodes with fake shapes) and gives the eager result."""
    def attend(q, k, v, scores):
        idx, usable = torch.ops.attn_lab.select(scores, 8)
        return torch.ops.attn_lab.selected_softmax(q, k, v, idx.view(1, 1, 6, 8), usable.view(1, 1, 6, 8), 0) * 2

    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 30, 16, generator=g), \
        torch.randn(1, 2, 30, 16, generator=g)
    scores = torch.randn(6, 30, generator=g)
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, scores), attend(q, k, v, scores))


@pytest.mark.usefixtures("built")
def test_a_backward_through_a_kernel_is_refused_with_a_sentence():
    """The ops take no gradient: called with tensors that want one, the forward runs and a backward through it
    raises a sentence naming the op (the attention functions send such calls to the torch form instead)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g, requires_grad=True) for _ in range(3))
    idx = torch.tensor([[[[0, 1], [1, 2], [0, 3], [2, 3]]]])
    out = native.selected_softmax(q, k, v, idx, torch.ones_like(idx, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="attn_lab::selected_softmax \\(a C\\+\\+ kernel\\) has no backward"):
        out.sum().backward()


def test_the_header_declares_each_kernel_once_from_the_table():
    """signatures.h holds one extern "C" declaration a kernel, and attn_signature; every C type maps to a ctypes
    type, and the hash the library carries changes with any declaration."""
    header = signatures.header()
    for k in signatures.KERNELS:
        assert header.count(f" {k.name}(") == 1
        assert all(signatures.ctype(t) is not None for t in k.types())  # (void is the return type only)
    assert f"const char* {signatures.SIGNATURE_FUNCTION}(void);" in header
    changed = (signatures.KERNELS[0].__class__("attn_unused", "void"),)
    assert signatures.signature(signatures.KERNELS + changed) != signatures.signature()
    with pytest.raises(ValueError, match="no ctypes type for the C type 'short'"):
        signatures.ctype("short")


def with_declaration(monkeypatch, name: str, old: str, new: str) -> None:
    """The table with `old` in kernel `name`'s arguments replaced by `new` (as a careless edit would)."""
    table = tuple(k.__class__(k.name, k.returns, tuple(a.replace(old, new) for a in k.args)) if k.name == name else k
                  for k in signatures.KERNELS)
    assert table != signatures.KERNELS
    monkeypatch.setattr(signatures, "KERNELS", table)


@pytest.mark.parametrize("name,old,new", [("attn_select_f32", "int64_t kk", "double kk"),
                                          ("attn_selected_softmax_f64", "double scale", "float scale"),
                                          ("attn_index_scores_f32", "const float* w", "float* w")])
def test_a_declaration_that_differs_from_the_cpp_fails_the_build_loudly(name, old, new, tmp_path, monkeypatch):
    """The table changed and the C++ not (an argument's type, a pointer's const): the compiler refuses the
    definition against the generated declaration, and `build` raises a sentence with its words, naming the
    function; nothing is loaded."""
    if native.compiler() is None:
        pytest.skip("no C++ compiler here (set CXX to one)")
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(toolchain, "TRIES", ((),))  # one plain try: the refusal is the same with any flags
    monkeypatch.setenv(native.CACHE, str(tmp_path))
    with_declaration(monkeypatch, name, old, new)
    with pytest.raises(RuntimeError, match=f"cannot be built: .*conflicting declaration of C function .*{name}"):
        native.build()
    assert native.library() is None and native.describe().startswith("torch ops: the build failed")


def test_a_library_built_from_other_declarations_is_refused_then_rebuilt_with_a_new_handle(tmp_path, monkeypatch):
    """A library in the cache under this build's name but built from other declarations (an older table: one more
    function declared) is refused at load, not called; `build` builds it again and loads the new file through a new
    handle (the dynamic loader, asked for the same name, would hand back the stale one), whose hash is the table's
    and whose selection is the stable sort's."""
    if native.compiler() is None:
        pytest.skip("no C++ compiler here (set CXX to one)")
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(toolchain, "TRIES", ((),))
    monkeypatch.setenv(native.CACHE, str(tmp_path))
    cxx = native.compiler()
    older = signatures.KERNELS + (signatures.Kernel("attn_retired", "void", ("int64_t n",)),)
    with monkeypatch.context() as m:
        m.setattr(signatures, "KERNELS", older)
        stale = tmp_path / "stale.so"
        assert toolchain._compile(cxx, native.FLAGS, stale) is None
    (tmp_path / "native").mkdir(mode=0o700)
    target = tmp_path / "native" / native.targets(cxx)[0][1]
    shutil.copy(stale, target)
    with pytest.raises(native.Stale, match="built from other kernel declarations"):
        toolchain._load(target)
    assert native.library() is None and "built from other kernel declarations" in native.describe()
    assert native.build().startswith("C++ (")
    lib = native.library()
    assert lib.attn_signature() == signatures.signature().encode()
    scores = torch.randn(3, 500, generator=torch.Generator().manual_seed(4))
    assert torch.equal(native.select(scores, 50)[0], stable_top(scores, 50)[0])
