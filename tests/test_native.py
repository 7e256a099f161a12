"""The compiled CPU kernel: when it is used, and its results against independent references.

The references: the explicit block-diagonal rotation in float64 (tests/reference.py), and
torch's own float32 arithmetic and bfloat16 rounding for the bit-level checks.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch
from reference import angles, backend_name, rope_by_pairs, thetas

from ropelib import apply_rope, generate_rope_embeddings, kernels, native

F64 = torch.float64
LAYOUTS = ["interleaved", "half"]


def angles64(seq: int, dim: int) -> torch.Tensor:
    return angles(torch.arange(seq), thetas(dim))


def test_kernel_is_built_and_chosen_for_its_dtypes():
    assert native.unavailable_reason() is None
    for dtype in native.DTYPES:
        x = torch.zeros(2, 4, 8, dtype=dtype)
        assert backend_name(x, 8) == "native"
    assert backend_name(torch.zeros(2, 4, 8, dtype=torch.float16), 8) != "native"
    strided_channels = torch.zeros(2, 4, 16)[..., ::2]
    assert backend_name(strided_channels, 8) != "native"
    previous = native.set_enabled(False)
    try:
        assert backend_name(torch.zeros(2, 4, 8), 8) != "native"
    finally:
        native.set_enabled(previous)


def test_set_enabled_rejects_non_bools():
    with pytest.raises(TypeError, match="enabled must be a bool, got int"):
        native.set_enabled(1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_transposed_view_broadcast_positions_and_partial_rotation(layout, dtype):
    """q as attention modules make it, (B, S, H, D).transpose(1, 2), per-batch positions
    (tables broadcast over heads), rotary_dim < head_dim: strides handled without copies."""
    batch, seq, heads, dim, rd = 3, 7, 4, 12, 8
    x = torch.randn(batch, seq, heads, dim, dtype=dtype).transpose(1, 2)
    positions = torch.randint(0, 50, (batch, seq))
    cos, sin = generate_rope_embeddings(50, rd, dtype=F64)
    assert backend_name(x, rd) == "native"
    result = apply_rope(x, cos, sin, layout=layout, positions=positions, rotary_dim=rd)
    tol = 1e-12 if dtype == F64 else 1e-6
    for b in range(batch):
        expected = rope_by_pairs(x[b].to(F64), angles64(50, rd)[positions[b]], layout)
        torch.testing.assert_close(result[b].to(F64), expected, rtol=tol, atol=tol)


def torch_float32_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
                       ) -> torch.Tensor:
    """The rotation in torch's float32 arithmetic, one rounding per multiply and add."""
    h = x.shape[-1] // 2
    a, b = (x[..., :h], x[..., h:]) if layout == "half" else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos - b * sin, a * sin + b * cos
    return (torch.cat((first, second), -1) if layout == "half"
            else torch.stack((first, second), -1).flatten(-2))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_bfloat16_rounds_once_like_torch(layout, in_place):
    """bf16 in, float32 arithmetic, one rounding: bit-identical to torch doing the same float32
    operations and rounding with .to(bfloat16), for rows of 1 to 40 pairs (in the half layout:
    vector blocks of 16 pairs, or of 32 on an AVX-512 CPU, plus a scalar tail, or only a tail)
    and transposed views. The inputs are random bit patterns, and one row cycles through NaN,
    inf, -inf, the largest finite value, a negative NaN and the smallest subnormal, in every
    channel; every NaN comes out as 0x7fc0."""
    torch.manual_seed(0)
    specials = torch.tensor([0x7fc0, 0x7f80, 0xff80, 0x7f7f, 0xffff, 0x0001]).to(torch.int16)
    for dim in range(2, 82, 2):
        bits = torch.randint(-2**15, 2**15, (2, 7, 3, dim), dtype=torch.int16)
        bits[0, 3, 1] = specials.repeat(dim)[:dim].roll(dim // 2)
        x = bits.view(torch.bfloat16).transpose(1, 2)
        cos, sin = generate_rope_embeddings(7, dim)
        expected = torch_float32_rope(x.float(), cos, sin, layout)
        if in_place:
            result = x.clone()
            apply_rope(result, cos, sin, layout=layout, out=result)
        else:
            result = apply_rope(x, cos, sin, layout=layout)
        nan = expected.isnan()
        assert nan.any() and (~nan).any(), f"head_dim={dim}"
        assert torch.equal(result.isnan(), nan), f"head_dim={dim}"
        assert torch.equal(result[~nan].view(torch.int16),
                           expected[~nan].to(torch.bfloat16).view(torch.int16)), f"head_dim={dim}"
        assert (result[nan].view(torch.int16) == 0x7fc0).all(), f"head_dim={dim}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_float32_bit_identical_to_torch_for_every_row_width(layout, in_place):
    """Rows of 1 to 20 pairs (vector blocks of 8 pairs plus a scalar tail, or only a tail),
    transposed views, in place or not: the same bits as torch's float32 operations."""
    for dim in range(2, 42, 2):
        x = torch.randn(2, 5, 3, dim).transpose(1, 2)
        cos, sin = generate_rope_embeddings(5, dim)
        expected = torch_float32_rope(x, cos, sin, layout)
        if in_place:
            result = x.clone()
            apply_rope(result, cos, sin, layout=layout, out=result)
        else:
            result = apply_rope(x, cos, sin, layout=layout)
        assert torch.equal(result, expected), f"head_dim={dim}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("native_on", [True, False], ids=["native", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.bfloat16, torch.float16])
def test_inverse_rotates_by_minus_theta(layout, native_on, dtype):
    """``inverse=True`` (the gradient's rotation) gives the bits of the rotation with a
    negated sin table, on every path (the compiled loop's vector blocks and scalar tails, the
    eager complex, upcast and pairs paths), and undoes the forward rotation (float64
    reference with the angles negated)."""
    previous = native.set_enabled(native_on)
    try:
        for dim, rd in ((8, 8), (40, 40), (64, 48)):
            x = torch.randn(2, 6, 3, dim).transpose(1, 2).to(dtype)
            cos, sin = generate_rope_embeddings(6, rd, dtype=F64 if dtype == F64 else torch.float32)
            inverse = kernels.rotate(x, cos, sin, layout, rd, True)
            assert torch.equal(inverse, kernels.rotate(x, cos, -sin, layout, rd)), (dim, rd)
            expected = rope_by_pairs(x.to(F64)[..., :rd], -angles64(6, rd), layout)
            tol = 1e-12 if dtype == F64 else 1e-2 if dtype.itemsize == 2 else 1e-6
            torch.testing.assert_close(inverse[..., :rd].to(F64), expected, rtol=tol, atol=tol)
            assert torch.equal(inverse[..., rd:], x[..., rd:])
    finally:
        native.set_enabled(previous)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_threads_split_rows_without_changing_a_bit(layout):
    x = torch.randn(4, 8, 300, 64)
    cos, sin = generate_rope_embeddings(300, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = apply_rope(x, cos, sin, layout=layout)
        torch.set_num_threads(3)
        split = apply_rope(x, cos, sin, layout=layout)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, split)
    torch.testing.assert_close(split.to(F64), rope_by_pairs(x.to(F64), angles64(300, 64), layout),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("tables", ["per_head", "broadcast"])
@pytest.mark.parametrize("rows", ["whole runs", "runs cut for threads", "tiles"])
def test_tiles_visit_every_row_once_for_any_table_strides(dtype, tables, rows):
    """The loop walks rows in tiles of the seq dim, each tile over every head before the next
    (so a table broadcast over heads is read from a cache): a tile is the whole seq where the
    tables of a seq fit in ``TABLE_CACHE_BYTES``, ``TABLE_TILE_BYTES`` of table rows where they
    are larger, and with several threads runs are cut until each thread gets a few units. In
    each case (the tile ``native.tile_rows`` gives for it is checked first), with tables that
    change along every dim (per batch and head) or only along seq, a partial rotation and 1, 2
    or 5 threads, every row is rotated once by its own angles (float64 reference) and the
    threads change no bit; where the seq is cut, the last tile is partial."""
    torch.manual_seed(0)
    acc_bytes = 8 if dtype == F64 else 4
    batch, heads, seq, dim, rd = {
        "whole runs": (2, 4, 307, 80, 64),  # 8 runs: 4 for each of the 2 threads it gets
        "runs cut for threads": (1, 2, 2053, 80, 64),  # 2 runs for the 5 threads it gets
        "tiles": (1, 2, native.TABLE_CACHE_BYTES // (16 * acc_bytes) + 307, 24, 16),
    }[rows]
    most = min(5, batch * heads * seq * dim // native.PARALLEL_ELEMENTS)  # as rotate picks
    tile = native.tile_rows(seq, batch * heads, rd * acc_bytes, most)
    if rows == "whole runs":
        assert tile == seq
    elif rows == "runs cut for threads" and kernels.native_status().threaded:
        assert most == 5 and tile < seq and seq % tile
    elif rows == "tiles":
        assert tile == native.TABLE_TILE_BYTES // (rd * acc_bytes) and seq % tile
    x = torch.randn(batch, heads, seq, dim, dtype=F64)
    positions = torch.randint(0, 5000, (batch, heads, seq) if tables == "per_head" else (seq,))
    theta = angles(positions.reshape(-1), thetas(rd)).reshape(*positions.shape, rd // 2)
    expected = rope_by_pairs(x[..., :rd], theta, "half")
    accumulate = F64 if dtype == F64 else torch.float32
    cos, sin = theta.cos().to(accumulate), theta.sin().to(accumulate)
    x = x.to(dtype)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 5):
            torch.set_num_threads(n)
            results.append(native.rotate(x, cos, sin, "half", rd))
            in_place = x.clone()
            native.rotate(in_place, cos, sin, "half", rd, out=in_place)
            assert torch.equal(in_place, results[-1])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])
    tol = {F64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(results[0][..., :rd].to(F64), expected, rtol=tol, atol=tol)
    assert torch.equal(results[0][..., rd:], x[..., rd:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 3, 307, 80), (1, 1, 307, 1100)])
def test_multi_axis_positions_rotate_each_pair_by_its_axis(dtype, layout, shape):
    """With positions and axes (M-RoPE) the CPU backend rotates pair i of a token at
    coordinates p by the table row p[axes[i]] (it gathers the rows, then runs the loop):
    against float64 rotations by the angles p[axes[i]] * theta_i, for positions shared by the
    batch or one row per batch entry, tokens on the diagonal and off it, a partial rotation,
    out= and in place, 1, 2 or 5 threads (the same bits), and the inverse, which undoes it."""
    torch.manual_seed(0)
    (batch, heads, seq, dim), rd, k = shape, 64, 3
    axes = torch.tensor([2, 0, 1, 1] * (rd // 8) + [0] * (rd // 4))[:rd // 2]
    table_len = 900
    theta = angles(torch.arange(table_len), thetas(rd))
    cos, sin = theta.cos().to(F64 if dtype == F64 else torch.float32), theta.sin()
    sin = sin.to(cos.dtype)
    diagonal = torch.randint(0, table_len, (batch, seq, 1)).expand(batch, seq, k)
    positions = torch.where(torch.rand(batch, seq, 1) < 0.4, diagonal,
                            torch.randint(0, table_len, (batch, seq, k)))
    x = torch.randn(batch, heads, seq, dim, dtype=F64)
    xd = x.to(dtype)
    assert native.assess([xd], [None], cos, sin, rd, positions[:, None])[0] is None
    tol = {F64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    threads = torch.get_num_threads()
    for p in (positions[0], positions):  # (seq, k), (batch, seq, k)
        exact = p.index_select(-1, axes).to(F64) * thetas(rd)
        exact = exact.expand(batch, 1, seq, rd // 2) if p.ndim == 2 else exact[:, None]
        expected = rope_by_pairs(x[..., :rd], exact.expand(batch, heads, seq, rd // 2), layout)
        results = []
        try:
            for n in (1, 2, 5):
                torch.set_num_threads(n)
                results.append(apply_rope(xd, cos, sin, layout=layout, rotary_dim=rd,
                                          positions=p, axes=axes))
                in_place = xd.clone()
                apply_rope(in_place, cos, sin, layout=layout, rotary_dim=rd, positions=p,
                           axes=axes, out=in_place)
                assert torch.equal(in_place, results[-1])
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(results[0], r) for r in results[1:])
        torch.testing.assert_close(results[0][..., :rd].to(F64), expected, rtol=tol, atol=tol)
        assert torch.equal(results[0][..., rd:], xd[..., rd:])
        coordinates = p[:, None] if p.ndim == 3 else p[None, None]
        inverse = kernels.rotate(results[0], cos, sin, layout, rd, True, coordinates, axes)
        torch.testing.assert_close(inverse.to(F64), xd.to(F64), rtol=2 * tol, atol=2 * tol)


def test_coordinates_and_axes_out_of_range_are_named():
    """The operators' coordinates and axes are checked before a row is read with them (a
    ValueError naming both ranges, as the operators' doc says); wide rows
    (8192 channels) are gathered and rotated by the loop too."""
    x = torch.randn(1, 2, 40, 16)
    cos, sin = torch.randn(50, 8), torch.randn(50, 8)
    positions = torch.randint(0, 50, (1, 1, 40, 2))
    axes = torch.tensor([0, 1] * 4)
    for bad_positions, bad_axes in ((positions.clamp_max(49) + (positions == 7) * 43, axes),
                                    (positions - (positions == 9) * 10, axes),
                                    (positions, axes.clone().fill_(2)),
                                    (positions, axes - 1)):
        with pytest.raises(ValueError, match=r"positions must be in \[0, 50\)"):
            kernels.rotate(x, cos, sin, "half", 16, False, bad_positions, bad_axes)
    wide = torch.randn(1, 1, 4, 8192)
    cos, sin = generate_rope_embeddings(4, 8192)
    assert native.assess([wide], [None], cos, sin, 8192, torch.zeros(4, 2))[0] is None
    coordinates = torch.tensor([[3, 0], [1, 2], [0, 0], [2, 1]])
    result = apply_rope(wide, cos, sin, positions=coordinates, axes=torch.arange(4096) % 2)
    exact = coordinates[:, torch.arange(4096) % 2].to(F64) * thetas(8192)
    torch.testing.assert_close(result.to(F64), rope_by_pairs(wide.to(F64), exact, "interleaved"),
                               rtol=1e-5, atol=1e-5)


def test_large_output_is_a_plain_contiguous_tensor():
    x = torch.randn(2, 4, 1024, 256)  # 8 MiB: asks for huge pages
    out = native.empty_like(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    cos, sin = generate_rope_embeddings(1024, 256)
    torch.testing.assert_close(apply_rope(x, cos, sin).to(F64),
                               rope_by_pairs(x.to(F64), angles64(1024, 256), "interleaved"),
                               rtol=1e-6, atol=1e-6)


def test_any_number_of_leading_dims():
    """Nine dims before the channels (the loop walks any number), and a 1-D x (one row)."""
    x = torch.randn(2, 1, 2, 1, 2, 1, 2, 3, 5, 8)
    cos, sin = generate_rope_embeddings(5, 8)
    assert backend_name(x, 8) == "native"
    torch.testing.assert_close(apply_rope(x, cos, sin).to(F64),
                               rope_by_pairs(x.to(F64), angles64(5, 8), "interleaved"),
                               rtol=1e-6, atol=1e-6)
    row = torch.randn(8)
    torch.testing.assert_close(native.rotate(row, cos[3], sin[3], "half", 8).to(F64),
                               rope_by_pairs(row.to(F64), angles64(5, 8)[3], "half"),
                               rtol=1e-6, atol=1e-6)


def test_empty_inputs():
    cos, sin = generate_rope_embeddings(4, 8)
    x = torch.randn(0, 2, 4, 8)
    assert apply_rope(x, cos, sin).shape == (0, 2, 4, 8)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_on_one_thread():
    """A DataLoader worker is a fork and runs torch on one thread (OpenMP's pool does not
    survive a fork); the kernel, which shares that pool, works there."""
    x = torch.randn(4, 8, 256, 64)
    cos, sin = generate_rope_embeddings(256, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = apply_rope(x, cos, sin)  # the parent's OpenMP threads now exist
    finally:
        torch.set_num_threads(threads)
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            os._exit(0 if torch.equal(apply_rope(x, cos, sin), expected) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_built_with_openmp_here():
    assert kernels.native_status().threaded


def test_compiler_without_openmp_gives_a_single_threaded_kernel(monkeypatch, tmp_path):
    wrapper = tmp_path / "cc-without-openmp"
    wrapper.write_text('#!/bin/sh\ncase "$*" in *-fopenmp*) exit 1;; esac\nexec cc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("ROPELIB_CACHE_DIR", str(tmp_path / "cache"))
    native._load.cache_clear()
    threads = torch.get_num_threads()
    try:
        assert native.unavailable_reason() is None and not kernels.native_status().threaded
        torch.set_num_threads(2)
        x = torch.randn(4, 8, 128, 64)
        cos, sin = generate_rope_embeddings(128, 64)
        assert backend_name(x, 64) == "native"
        torch.testing.assert_close(apply_rope(x, cos, sin, layout="half").to(F64),
                                   rope_by_pairs(x.to(F64), angles64(128, 64), "half"),
                                   rtol=1e-6, atol=1e-6)
    finally:
        torch.set_num_threads(threads)
        monkeypatch.undo()
        native._load.cache_clear()


def test_native_status_names_the_compiler_that_built_the_loaded_loop(monkeypatch, tmp_path):
    """The loop loaded once stays loaded when $CC changes afterwards: native_status names
    the compiler that built it, not the one $CC names now."""
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text('#!/bin/sh\nexec cc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("ROPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROPELIB_BACKEND", raising=False)
    native._load.cache_clear()
    try:
        assert native.unavailable_reason() is None
        monkeypatch.setenv("CC", "clang-that-built-nothing")
        status = kernels.native_status()
        assert status.path == "native" and str(wrapper) in status.reason, status
        assert "clang-that-built-nothing" not in status.reason
    finally:
        monkeypatch.undo()
        native._load.cache_clear()


def test_without_a_compiler_the_eager_paths_take_over(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("ROPELIB_CACHE_DIR", str(tmp_path / "cache"))
    native._load.cache_clear()
    try:
        reason = native.unavailable_reason()
        assert reason is not None and "no-such-compiler" in reason
        x = torch.randn(2, 3, 5, 8)
        assert backend_name(x, 8) == "eager"
        cos, sin = generate_rope_embeddings(5, 8)
        torch.testing.assert_close(apply_rope(x, cos, sin, layout="half").to(F64),
                                   rope_by_pairs(x.to(F64), angles64(5, 8), "half"),
                                   rtol=1e-6, atol=1e-6)
    finally:
        monkeypatch.undo()
        native._load.cache_clear()
    assert native.unavailable_reason() is None


def test_compiles_into_a_fresh_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ROPELIB_CACHE_DIR", str(tmp_path))
    native._load.cache_clear()
    try:
        assert native.cache_dir() == tmp_path
        assert native.unavailable_reason() is None
        assert len(list(tmp_path.glob("native_rope-*.so"))) == 1
        assert not list(tmp_path.glob("tmp*"))
    finally:
        monkeypatch.undo()
        native._load.cache_clear()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_coordinate_per_token_without_axes(layout):
    """The operators' positions without axes (one coordinate per token, what apply_rope hands
    a GPU): the CPU backend rotates every pair of a token by its one table row, like the
    eager gather and the float64 rotation."""
    x = torch.randn(3, 2, 5, 16)
    cos, sin = generate_rope_embeddings(40, 16)
    positions = torch.randint(0, 40, (3, 5))
    coordinates = positions[:, None, :, None]
    assert native.assess([x], [None], cos, sin, 16, coordinates)[0] is None
    compiled = kernels.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    previous = native.set_enabled(False)
    try:
        by_gather = kernels.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    finally:
        native.set_enabled(previous)
    torch.testing.assert_close(compiled, by_gather, rtol=1e-6, atol=1e-6)  # two roundings
    expected = rope_by_pairs(x.to(F64), angles64(40, 16)[positions][:, None], layout)
    torch.testing.assert_close(compiled.to(F64), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("where", ["rows", "positions", "M-RoPE"])
@pytest.mark.parametrize("forced", [None, "native", "triton"])
def test_tables_that_are_lazily_negated_views_are_read_as_their_values(monkeypatch, forced,
                                                                       where):
    """cos and sin may be lazily negated views (``t.conj().imag`` of a complex t): values
    their memory stores negated. The compiled loop and the Triton kernel read memory as it
    is, so they refuse such tables where they would read them (a forced backend says why;
    rows gathered first are new tensors, which they take); every call that runs rotates by
    the tables' values, as with the plain tables (float64 reference)."""
    if forced == "triton":
        pytest.importorskip("triton")
    cos, sin = generate_rope_embeddings(8, 8)
    negated = [torch._neg_view(-t) for t in (cos, sin)]
    assert all(t.is_neg() for t in negated) and torch.equal(negated[0], cos)
    x = torch.randn(2, 2, 3, 8)
    coordinates, axes = torch.tensor([[3, 0, 1], [0, 5, 2], [7, 7, 7]]), [0, 1, 2, 1]
    given = {"rows": {}, "positions": {"positions": torch.tensor([3, 0, 5])},
             "M-RoPE": {"positions": coordinates, "axes": torch.tensor(axes)}}[where]
    table = {"rows": angles(torch.arange(3), thetas(8)),  # (tokens, pairs), float64
             "positions": angles(torch.tensor([3, 0, 5]), thetas(8)),
             "M-RoPE": coordinates[:, axes].to(torch.float64) * thetas(8)}[where]
    expected = rope_by_pairs(x, table, "half")
    if forced:
        monkeypatch.setenv("ROPELIB_BACKEND", forced)
    try:
        result = apply_rope(x, *negated, layout="half", **given)
    except ValueError as error:
        assert forced, error
        assert "must not be lazily negated" in str(error)
        return
    torch.testing.assert_close(result, expected.float(), rtol=1e-6, atol=1e-6)


def test_threads_loading_a_cold_cache_build_the_loop_once(monkeypatch, tmp_path):
    """Threads that ask for the loop at once on an empty cache build it once between them."""
    monkeypatch.setenv("ROPELIB_CACHE_DIR", str(tmp_path))
    builds = []
    compile_once = native._compile

    def counting(*args):
        builds.append(args)
        compile_once(*args)

    monkeypatch.setattr(native, "_compile", counting)
    native._load.cache_clear()
    try:
        threads = [threading.Thread(target=native._load.__wrapped__) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(builds) == 1
    finally:
        monkeypatch.undo()
        native._load.cache_clear()
