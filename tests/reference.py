"""Independent reference implementations the tests compare ropelib against.

Nothing here imports ropelib. Everything is written from the papers or from the public
reference code it names, in float64, as plainly as possible (slow is fine: shapes are small):

- RoFormer eq. (15): the block-diagonal matrix R_{Theta,m}, built entry by entry.
- Hugging Face Llama: ``q * cos + rotate_half(q) * sin`` with ``cos = cat(freqs, freqs)``,
  ``repeat_kv`` and the eager attention; the Meta-to-HF ``permute`` of the conversion script.
- Meta Llama: ``view_as_complex(x) * polar(1, angles)``.
- Plain softmax attention and the quadratic (N x N) form of linear attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

F64 = torch.float64


# --------------------------------------------------------------------------- frequencies

def thetas(dim: int, base: float = 10000.0) -> torch.Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1, with Python floats, as float64."""
    return torch.tensor([base ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=F64)


def angles(positions, inv_freq: torch.Tensor) -> torch.Tensor:
    """m * theta_i in float64: positions ``(...)`` -> ``(..., len(inv_freq))``."""
    positions = torch.as_tensor(positions).to(F64)
    return positions.unsqueeze(-1) * inv_freq.to(F64)


# --------------------------------------------------------------------------- rotations

def pair_channels(i: int, rotary_dim: int, layout: str) -> tuple[int, int]:
    """The two channels that pair i rotates: (2i, 2i+1) interleaved, (i, i + rd/2) half."""
    if layout == "interleaved":
        return 2 * i, 2 * i + 1
    if layout == "half":
        return i, i + rotary_dim // 2
    raise AssertionError(layout)


def rotation_matrix(angle_row: torch.Tensor, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """R_{Theta,m} of RoFormer eq. (15) for one position, ``(dim, dim)`` float64.

    ``angle_row`` holds m * theta_i for the rotary_dim / 2 rotated pairs; channels past
    rotary_dim = 2 * len(angle_row) are left alone (identity rows).
    """
    rotary_dim = 2 * angle_row.shape[0]
    R = torch.zeros(dim, dim, dtype=F64)
    for c in range(rotary_dim, dim):
        R[c, c] = 1.0
    for i in range(rotary_dim // 2):
        a, b = pair_channels(i, rotary_dim, layout)
        c, s = math.cos(float(angle_row[i])), math.sin(float(angle_row[i]))
        R[a, a], R[a, b] = c, -s
        R[b, a], R[b, b] = s, c
    return R


def rope_by_matrix(x: torch.Tensor, angle_table: torch.Tensor, layout: str = "interleaved"
                   ) -> torch.Tensor:
    """Multiply every row x[..., m, :] by R_{Theta,m}: x ``(..., S, d)``, angles ``(S, rd/2)``.

    ``angle_table`` may also be ``(B, S, rd/2)`` (per-batch positions) for x ``(B, ..., S, d)``.
    """
    x = x.to(F64)
    dim = x.shape[-1]
    mats = torch.stack([rotation_matrix(row, dim, layout)
                        for row in angle_table.reshape(-1, angle_table.shape[-1])])
    mats = mats.reshape(*angle_table.shape[:-1], dim, dim)
    if angle_table.ndim == 3:  # (B, S, ...) -> (B, 1, ..., 1, S, d, d)
        mats = mats.reshape(mats.shape[0], *([1] * (x.ndim - 3)), *mats.shape[1:])
    return (mats @ x.unsqueeze(-1)).squeeze(-1)


def rope_by_pairs(x: torch.Tensor, angle_table: torch.Tensor, layout: str = "interleaved"
                  ) -> torch.Tensor:
    """RoFormer eq. (34), pair by pair: a' = a cos - b sin, b' = a sin + b cos, in float64.

    The same map as ``rope_by_matrix`` without d x d matrices, for long sequences.
    x ``(..., S, d)``, angles ``(S, rd/2)``; channels past rd are copied.
    """
    x = x.detach().cpu().to(F64)
    angle_table = angle_table.to(F64)
    rotary_dim = 2 * angle_table.shape[-1]
    out = x.clone()
    for i in range(rotary_dim // 2):
        a, b = pair_channels(i, rotary_dim, layout)
        c, s = angle_table[..., i].cos(), angle_table[..., i].sin()
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., a] * s + x[..., b] * c
    return out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotate_half: cat(-x2, x1)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary(x: torch.Tensor, angle_table: torch.Tensor) -> torch.Tensor:
    """HF Llama / GPT-NeoX: emb = cat(freqs, freqs); x_rot * cos + rotate_half(x_rot) * sin.

    Partial rotation (NeoX/Phi): the first rotary_dim = 2 * angle_table.shape[-1] channels are
    rotated, the rest concatenated back unchanged.
    """
    x = x.to(F64)
    rd = 2 * angle_table.shape[-1]
    emb = torch.cat((angle_table, angle_table), dim=-1).to(F64)
    cos, sin = emb.cos(), emb.sin()
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def meta_apply_rotary(x: torch.Tensor, angle_table: torch.Tensor) -> torch.Tensor:
    """Meta Llama: view_as_complex(x) * polar(1, angles), x ``(B, S, H, d)``, angles ``(S, d/2)``."""
    x = x.to(F64)
    freqs_cis = torch.polar(torch.ones_like(angle_table, dtype=F64), angle_table.to(F64))
    x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    freqs_cis = freqs_cis.view(1, x.shape[1], 1, x_.shape[-1])
    return torch.view_as_real(x_ * freqs_cis).flatten(3)


def half_from_interleaved_perm(dim: int, rotary_dim: int | None = None) -> list[int]:
    """[0, 2, 4, ..., rd-2, 1, 3, ..., rd-1, rd, ..., dim-1]."""
    rd = dim if rotary_dim is None else rotary_dim
    return list(range(0, rd, 2)) + list(range(1, rd, 2)) + list(range(rd, dim))


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The ``permute`` of HF's convert_llama_weights_to_hf.py (Meta rows -> HF rows)."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


# --------------------------------------------------------------------------- attention

def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HF's repeat_kv: (B, Hkv, S, d) -> (B, Hkv * n_rep, S, d), each KV head repeated n_rep times."""
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def lower_right_causal(q_len: int, k_len: int) -> torch.Tensor:
    """Boolean (q_len, k_len): the last query sees every key; query i sees j <= i + k_len - q_len."""
    m = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        for j in range(k_len):
            m[i, j] = j <= i + (k_len - q_len)
    return m


def softmax_attention(q, k, v, mask=None, causal=False) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention in float64. q ``(B, H, Nq, d)``, k/v ``(B, H, Nk, d)``.

    mask: boolean (True = may attend) or float (added). A query row allowed nothing gets zero
    weights and a zero output. Returns ``(out, weights)``.
    """
    q, k, v = (t.detach().cpu().to(F64) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask.cpu()
        else:
            scores = scores + mask.cpu().to(F64)
            allowed = allowed & ~torch.isneginf(scores)
    if causal:
        allowed = allowed & lower_right_causal(q.shape[-2], k.shape[-2])
    scores = scores.masked_fill(~allowed, float("-inf"))
    any_allowed = allowed.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~any_allowed, 0.0), dim=-1)
    weights = torch.where(any_allowed, weights, torch.zeros_like(weights))
    return weights @ v, weights


def attention_module_reference(module, query, key, value, q_angles, k_angles, mask=None,
                               causal=False, scale: float = 1.0
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """What StandardAttentionWithRoPE must compute, from its weights, in float64 on the CPU.

    q_angles/k_angles: ``(Nq, rd/2)``/``(Nk, rd/2)`` (or with a leading batch dim) angle
    tables for the module's layout, or None for no rotation. ``scale`` multiplies the
    rotated channels of q and k (YaRN's attention factor, which multiplies cos and sin).
    """
    def proj(lin, x):
        w = lin.weight.detach().cpu().to(F64)
        b = None if lin.bias is None else lin.bias.detach().cpu().to(F64)
        return F.linear(x.detach().cpu().to(F64), w, b)

    H, Hkv, d = module.num_heads, module.num_kv_heads, module.head_dim
    B, Nq, Nk = query.shape[0], query.shape[1], key.shape[1]
    q = proj(module.q_proj, query).view(B, Nq, H, d).transpose(1, 2)
    k = proj(module.k_proj, key).view(B, Nk, Hkv, d).transpose(1, 2)
    v = proj(module.v_proj, value).view(B, Nk, Hkv, d).transpose(1, 2)
    if q_angles is not None:
        q = rope_by_matrix(q, q_angles, module.layout)
        k = rope_by_matrix(k, k_angles, module.layout)
        rd = 2 * q_angles.shape[-1]
        q[..., :rd] *= scale
        k[..., :rd] *= scale
    k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
    out, weights = softmax_attention(q, k, v, mask, causal)
    out = out.transpose(1, 2).reshape(B, Nq, H * d)
    return proj(module.o_proj, out), weights


def hf_llama_attention(hidden, w: dict, num_heads: int, num_kv_heads: int, angle_table,
                       causal: bool = True) -> torch.Tensor:
    """Hugging Face LlamaAttention (eager), float64: w holds q/k/v/o_proj weights, no bias."""
    hidden = hidden.to(F64)
    B, N, _ = hidden.shape
    d = w["q_proj.weight"].shape[0] // num_heads
    q = (hidden @ w["q_proj.weight"].to(F64).T).view(B, N, num_heads, d).transpose(1, 2)
    k = (hidden @ w["k_proj.weight"].to(F64).T).view(B, N, num_kv_heads, d).transpose(1, 2)
    v = (hidden @ w["v_proj.weight"].to(F64).T).view(B, N, num_kv_heads, d).transpose(1, 2)
    q, k = hf_apply_rotary(q, angle_table), hf_apply_rotary(k, angle_table)
    k, v = repeat_kv(k, num_heads // num_kv_heads), repeat_kv(v, num_heads // num_kv_heads)
    scores = q @ k.transpose(2, 3) * d ** -0.5
    if causal:
        scores = scores + torch.full((N, N), float("-inf"), dtype=F64).triu(1)
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(B, N, num_heads * d)
    return out @ w["o_proj.weight"].to(F64).T


def meta_llama_attention(x, sd: dict, n_heads: int, n_kv_heads: int, angle_table,
                         causal: bool = True) -> torch.Tensor:
    """Meta's llama/model.py Attention.forward (no cache), float64; sd holds wq, wk, wv, wo."""
    x = x.to(F64)
    bsz, seqlen, _ = x.shape
    head_dim = sd["wq"].shape[0] // n_heads
    xq = (x @ sd["wq"].to(F64).T).view(bsz, seqlen, n_heads, head_dim)
    xk = (x @ sd["wk"].to(F64).T).view(bsz, seqlen, n_kv_heads, head_dim)
    xv = (x @ sd["wv"].to(F64).T).view(bsz, seqlen, n_kv_heads, head_dim)
    xq, xk = meta_apply_rotary(xq, angle_table), meta_apply_rotary(xk, angle_table)
    n_rep = n_heads // n_kv_heads
    keys = xk.repeat_interleave(n_rep, dim=2).transpose(1, 2)
    values = xv.repeat_interleave(n_rep, dim=2).transpose(1, 2)
    xq = xq.transpose(1, 2)
    scores = xq @ keys.transpose(2, 3) / math.sqrt(head_dim)
    if causal:
        scores = scores + torch.full((seqlen, seqlen), float("-inf"), dtype=F64).triu(1)
    scores = torch.softmax(scores, dim=-1)
    out = (scores @ values).transpose(1, 2).reshape(bsz, seqlen, -1)
    return out @ sd["wo"].to(F64).T


# --------------------------------------------------------------------------- linear attention

def quadratic_linear_attention(q, k, v, *, rotate=None, causal=False, feature_map=None):
    """Linear attention in its N x N form, float64 (Katharopoulos et al.; RoFormer 3.3).

    out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n), n <= m if causal.
    ``rotate`` maps phi(x) ``(..., S, d)`` to its rotated copy (numerator only).
    """
    phi = feature_map or (lambda t: F.elu(t) + 1.0)
    fq, fk = phi(q.to(F64)), phi(k.to(F64))
    nq, nk = (fq, fk) if rotate is None else (rotate(fq), rotate(fk))
    num = nq @ nk.transpose(-2, -1)
    den = fq @ fk.transpose(-2, -1)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        num, den = num.masked_fill(~keep, 0.0), den.masked_fill(~keep, 0.0)
    return (num @ v.to(F64)) / den.sum(-1, keepdim=True)


# --------------------------------------------------------------------------- the original module

def repeat_last_row(table: torch.Tensor, length: int) -> torch.Tensor:
    """The original module's padding of a short cos/sin table: repeat its last row."""
    if table.shape[0] >= length:
        return table[:length]
    pad = table[-1:].repeat(length - table.shape[0], 1)
    return torch.cat([table, pad], dim=0)


def backend_name(x: torch.Tensor, rotary_dim: int) -> str:
    """The backend ``ropelib.kernels`` picks for rotating x (a new output, rows given)."""
    from ropelib import kernels

    rows = torch.zeros(x.shape[-2], rotary_dim // 2, device=x.device)
    return kernels.choose_backend([x], [None], rows, rows, rotary_dim)[0].NAME


# --------------------------------------------------------------------------- comparisons

def assert_same(got: torch.Tensor, want: torch.Tensor, **close) -> None:
    """Two of ropelib's paths that must agree: bit for bit on the CPU, where both round the
    same float64 angles and products the same way; on a GPU, where one may run the Triton
    kernel (float32, fused multiply-adds) and the other eager PyTorch, or compute cos/sin
    there, within float32 rounding (``close``: assert_close's rtol/atol)."""
    assert got.device == want.device, (got.device, want.device)
    if got.device.type == "cpu":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.cpu(), want.cpu(), **close)


def device_side_error(script: str) -> str:
    """stderr of ``script`` run in a fresh Python process (after ``import torch``) followed by
    ``torch.cuda.synchronize()``, which must fail: a device-side assert ends the CUDA context
    of its process, so tests provoke one away from their own."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", f"import torch\n{script}\n"
                             "torch.cuda.synchronize()\n"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode != 0, result.stdout
    return result.stderr
