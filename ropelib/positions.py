"""Per-token positions the way models build them, ready for ``positions=`` of ``apply_rope``,
``RotaryEmbedding`` and ``StandardAttentionWithRoPE``.

RoPE rotates each token by its position, and a batch rarely holds one plain sequence:

- **Left padding** (batched generation): row b holds pads, then its tokens. A token's
  position counts the real tokens before it, ``cumsum(mask) - 1``, so every row starts at
  0 whatever its padding; pads get position 0 (they are masked out anyway). This is what
  Hugging Face's ``generate`` builds (``_prepare_position_ids_for_generation``).
- **After a KV cache**: the next tokens continue from each row's count of real tokens so
  far, which differs between rows of a padded batch.
- **Packed documents** (``cu_seqlens`` of FlashAttention's variable-length kernels, or
  Hugging Face's ``DataCollatorWithFlattening``): several documents concatenated into one
  row; positions restart at 0 at the start of each document.
- **Context parallelism**: the sequence is split over ranks, each rank holds some of its
  tokens and must turn them by their positions in the whole sequence.

Every helper returns int64 positions on the device of its input.
"""

from __future__ import annotations

import torch

from ._checks import as_int, check_count, check_int_tensor


def positions_from_padding_mask(attention_mask: torch.Tensor, *,
                                new_tokens: int | None = None) -> torch.Tensor:
    """Positions of a padded batch: ``cumsum(mask) - 1`` along the sequence, 0 at pads.

    Args:
        attention_mask: ``(batch, length)``, True (or nonzero) at real tokens, False (0) at
            pads; bool or integer. With a KV cache it covers the cached tokens and the new
            ones, as Hugging Face's ``attention_mask`` does during generation.
        new_tokens: return only the last ``new_tokens`` columns: the positions of the tokens
            a decoding step adds after the cache. Default: all of them.

    Returns:
        ``(batch, length)`` (or ``(batch, new_tokens)``) int64 positions.
    """
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got "
                        f"{type(attention_mask).__name__}")
    if attention_mask.ndim != 2 or attention_mask.is_floating_point() or (
            attention_mask.is_complex()):
        raise ValueError(f"attention_mask must be a (batch, length) bool or integer tensor "
                         f"(True = token, False = pad), got shape "
                         f"{tuple(attention_mask.shape)} and dtype {attention_mask.dtype}")
    tokens = attention_mask != 0
    positions = (tokens.long().cumsum(-1) - 1).masked_fill(~tokens, 0)
    if new_tokens is None:
        return positions
    length = attention_mask.shape[-1]
    new = as_int(new_tokens)
    if new is None or not 0 <= new <= length:
        raise ValueError(f"new_tokens must be an int in [0, {length}] (the mask's length), "
                         f"got {new_tokens!r}")
    return positions[:, length - new:]


def positions_after_cache(new_tokens: int, offset: int | torch.Tensor, *,
                          device: torch.device | str | None = None) -> torch.Tensor:
    """Positions ``offset .. offset + new_tokens - 1`` of tokens that follow a KV cache.

    Args:
        new_tokens: how many tokens this step adds.
        offset: the first new token's position: an int (every row alike; with a plain
            ``KVCache``, its ``length``) or a ``(batch,)`` integer tensor, one per row (in a
            left-padded batch, each row's number of real tokens so far,
            ``attention_mask.sum(-1)``).
        device: where the result goes when ``offset`` is an int (default: the CPU);
            otherwise ``offset``'s device.

    Returns:
        ``(new_tokens,)`` for an int offset, ``(batch, new_tokens)`` for a tensor; int64.
    """
    new = check_count("new_tokens", new_tokens, zero=True)
    if isinstance(offset, torch.Tensor) and offset.ndim == 1:
        offset = check_int_tensor("offset", offset)
        if offset.numel() and int(offset.min()) < 0:
            raise ValueError(f"offset must be >= 0, got min {int(offset.min())}")
        return offset[:, None] + torch.arange(new, device=offset.device)
    start = as_int(offset)
    if start is None or start < 0:
        raise ValueError(f"offset must be a non-negative int or a (batch,) integer tensor, got "
                         f"{offset!r}")
    return torch.arange(start, start + new, device=device)


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions of documents packed into one sequence, restarting at 0 in each.

    Args:
        cu_seqlens: ``(documents + 1,)`` cumulative lengths, ``[0, n_0, n_0 + n_1, ...]``
            (FlashAttention's ``cu_seqlens``, Hugging Face's ``cu_seq_lens_q``); integer,
            starting at 0, non-decreasing.

    Returns:
        ``(cu_seqlens[-1],)`` int64: ``0 .. n_0 - 1, 0 .. n_1 - 1, ...``.
    """
    cu = check_int_tensor("cu_seqlens", cu_seqlens)
    if cu.ndim != 1 or cu.numel() == 0:
        raise ValueError(f"cu_seqlens must have shape (documents + 1,), got {tuple(cu.shape)}")
    lengths = cu.diff()
    if int(cu[0]) != 0 or (lengths < 0).any():
        raise ValueError(f"cu_seqlens must start at 0 and never decrease (cumulative document "
                         f"lengths), got {cu.tolist()}")
    starts = cu[:-1].repeat_interleave(lengths)
    return torch.arange(int(cu[-1]), device=cu.device) - starts


def positions_for_context_parallel(seq_len: int, world_size: int, rank: int, *,
                                   load_balance: bool = True,
                                   cu_seqlens: torch.Tensor | None = None,
                                   per_document: bool = False,
                                   device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions of the tokens one rank holds when a sequence is split over
    ``world_size`` ranks for context parallelism, in the order of the rank's tokens.

    RoPE is relative: a rank that rotated its shard by local positions 0, 1, ... would get
    every score within the shard right and every score between shards wrong, silently.

    - ``load_balance=False``: rank r holds the r-th of R contiguous chunks,
      ``r N / R .. (r + 1) N / R - 1``.
    - ``load_balance=True`` (the layout of PyTorch's ``context_parallel`` and torchtitan,
      for causal attention): the sequence is cut into 2R chunks and rank r holds chunks r
      and 2R - 1 - r, so every rank gets one early and one late chunk and the same share of
      the causal mask's work.

    With ``cu_seqlens`` the sequence is documents packed end to end and positions restart
    at 0 in each document (``positions_from_cu_seqlens``). Two splits of packed documents
    are in use:

    - ``per_document=False`` (default): the split above, over the packed sequence whatever
      the document boundaries; what PyTorch's ``context_parallel`` does by default (its
      head-tail balancer sees one sequence).
    - ``per_document=True``: every document is split on its own, into 2R chunks (R with
      ``load_balance=False``), and rank r holds chunks r and 2R - 1 - r of each document,
      in document order: Transformer Engine's THD format, ring-flash-attn's varlen
      functions, and PyTorch's ``_PerDocumentHeadTailLoadBalancer`` as its docstring draws
      it (each document's causal work shared evenly). Note that torch 2.13 lists
      that balancer's order document by document and ``_context_parallel_shard`` cuts it
      into R contiguous pieces, so the tokens it hands a rank are not these (torch 2.15
      lists the order rank by rank); there, shard a
      ``positions_from_cu_seqlens(cu_seqlens)`` buffer beside the tokens instead.

    With ``torch.distributed.tensor.experimental.context_parallel``, which shards its
    ``buffers`` along their sequence dims in the head-tail layout (contiguous when its
    load balancing is off)::

        with context_parallel(mesh, buffers=[tokens], buffer_seq_dims=[1]):
            pos = positions_for_context_parallel(seq_len, mesh.size(), mesh.get_local_rank())
            out = attention(hidden, hidden, hidden, is_causal=True, positions=pos)

    Equivalently, ``torch.arange(seq_len)[None]`` among the buffers (sequence dim 1)
    becomes these positions, and tables of ``seq_len`` rows (sequence dim 0) become this
    rank's rows, to pass without positions.

    Args:
        seq_len: N, the length of the whole sequence (all ranks together).
        world_size: R, the ranks the sequence is split over (the context-parallel mesh's
            size).
        rank: r in ``[0, R)``, this rank's place in that mesh.
        load_balance: the head-tail layout above (default) or contiguous chunks.
        cu_seqlens: ``(documents + 1,)`` cumulative document lengths ending at N.
        per_document: split each document on its own (see above); needs ``cu_seqlens``,
            each document's length a multiple of 2R (of R with ``load_balance=False``).
        device: where the result goes (default: ``cu_seqlens``'s device, else the CPU).

    Returns:
        ``(N / R,)`` int64 positions, to pass as ``positions=`` to ``apply_rope``,
        ``RotaryEmbedding`` or ``StandardAttentionWithRoPE`` with this rank's q and k.

    Raises:
        ValueError: N not a multiple of 2R (load-balanced) or of R (contiguous): then the
            split is uneven, and PyTorch's ``context_parallel`` silently falls back to
            contiguous chunks when N is not a multiple of 2R. With ``per_document``, the
            same of a document's length.
    """
    n = check_count("seq_len", seq_len, zero=True)
    size = check_count("world_size", world_size)
    index = as_int(rank)
    if index is None or not 0 <= index < size:
        raise ValueError(f"rank must be an int in [0, {size}) (world_size={size}), got {rank!r}")
    chunks = 2 * size if load_balance else size
    if not isinstance(per_document, bool):
        raise TypeError(f"per_document must be a bool, got {type(per_document).__name__}")
    if per_document:
        return _per_document(n, chunks, index, load_balance, cu_seqlens, device)
    if n % chunks:
        layout = (f"2 * world_size = {chunks} equal chunks (load-balanced: rank r holds "
                  f"chunks r and {chunks - 1} - r)" if load_balance
                  else f"world_size = {chunks} equal chunks")
        raise ValueError(f"seq_len={n} does not split into {layout}; pad the sequence to a "
                         f"multiple of {chunks}, e.g. {n + chunks - n % chunks}"
                         + (", or pass load_balance=False (contiguous chunks)"
                            if load_balance and n % size == 0 else ""))
    if cu_seqlens is not None:
        within = positions_from_cu_seqlens(cu_seqlens)
        if within.shape[0] != n:
            raise ValueError(f"cu_seqlens must end at seq_len={n} (the packed documents "
                             f"fill the sequence), got cu_seqlens[-1]={within.shape[0]}")
        device = within.device if device is None else device
    chunk = n // chunks
    starts = [index * chunk] + ([(chunks - 1 - index) * chunk] if load_balance else [])
    tokens = torch.cat([torch.arange(s, s + chunk, device=device) for s in starts])
    return tokens if cu_seqlens is None else within.to(device)[tokens]


def _per_document(n: int, chunks: int, rank: int, load_balance: bool,
                  cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """``positions_for_context_parallel(..., per_document=True)``: each document cut into
    ``chunks`` equal chunks, the rank's chunk (and its mirror, load-balanced) of each, in
    document order; a chunk's positions are its offsets within the document."""
    if cu_seqlens is None:
        raise ValueError("per_document=True splits each packed document on its own: pass "
                         "cu_seqlens (the cumulative document lengths)")
    within = positions_from_cu_seqlens(cu_seqlens)  # checks cu_seqlens
    if within.shape[0] != n:
        raise ValueError(f"cu_seqlens must end at seq_len={n} (the packed documents fill the "
                         f"sequence), got cu_seqlens[-1]={within.shape[0]}")
    lengths = check_int_tensor("cu_seqlens", cu_seqlens).diff().tolist()
    for document, length in enumerate(lengths):
        if length % chunks:
            layout = (f"2 * world_size = {chunks}" if load_balance
                      else f"world_size = {chunks}")
            raise ValueError(f"per_document=True splits every document into {layout} equal "
                             f"chunks, but document {document} has {length} tokens; pad each "
                             f"document to a multiple of {chunks} (as Transformer Engine's THD "
                             "format asks)")
    device = cu_seqlens.device if device is None else device
    pieces = []
    for length in lengths:
        chunk = length // chunks
        starts = [rank * chunk] + ([(chunks - 1 - rank) * chunk] if load_balance else [])
        pieces += [torch.arange(start, start + chunk, device=device) for start in starts]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=device)
