"""Pure functions behind the book's figures (float64 NumPy in, NumPy out).

Conventions: theta_i = base^(-2i/d) for the d/2 pairs; a query at position m and a key at
position n are at distance D = m - n, and their RoPE score is q^T R_{Theta,n-m} k, which
in complex form (pair i as the number x_{2i} + i x_{2i+1}, the interleaved layout) is
Re[sum_i q_i conj(k_i) exp(i D theta_i)].
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_count, check_even_positive
from .scaling import default_frequencies


def rope_thetas(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """theta_i = base^(-2i/head_dim), shape ``(head_dim // 2,)``, float64."""
    return default_frequencies(head_dim, base).numpy()


def _frequencies(theta: object) -> np.ndarray:
    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim != 1 or theta.size == 0:
        raise ValueError(f"theta must be a non-empty 1-D array of frequencies, got shape {theta.shape}")
    if not np.all(np.isfinite(theta)):
        raise ValueError(f"theta must be finite, got {theta.tolist()}")
    return theta


def wavelengths(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """2 pi / theta_i: the number of positions pair i needs for one full turn, ``(head_dim // 2,)``."""
    return 2 * math.pi / rope_thetas(head_dim, base)


def cosine_sum(distance: object, theta: object) -> np.ndarray:
    """sum_i cos(distance * theta_i), of the shape of ``distance``.

    It is the RoPE score of q = k = (1, 0, 1, 0, ...) at distance ``distance`` (one unit
    vector per pair), d/2 times the cosine similarity of the two distances' rotation angles
    (the unit phasors exp(i distance theta_i)), and, for theta = (1, 0.3, 0.05), the
    three-frequency toy T(D) of chapter 6.
    """
    theta = _frequencies(theta)
    distance = np.asarray(distance, dtype=np.float64)
    return np.cos(distance[..., None] * theta).sum(axis=-1)


def most_similar_distances(theta: object, max_distance: int) -> tuple[int, float]:
    """The two distinct distances in 0 .. max_distance whose rotation angles look most alike.

    Distance D is represented by its unit phasors exp(i D theta_i), one per frequency; two
    distances are compared by the cosine similarity of these vectors,
    (1 / len(theta)) sum_i cos((D1 - D2) theta_i). That depends on the gap D1 - D2 only,
    so the closest pair is the gap in 1 .. max_distance with the largest similarity.

    Returns:
        ``(gap, similarity)``: the pairs (D, D + gap) are the most alike (1.0 would make
        them indistinguishable); the smallest such gap when several tie.
    """
    theta = _frequencies(theta)
    max_distance = check_count("max_distance", max_distance)
    gaps = np.arange(1, max_distance + 1)
    similarity = cosine_sum(gaps, theta) / theta.size
    best = int(np.argmax(similarity))
    return int(gaps[best]), float(similarity[best])


def phasor_partial_sums(distance: float, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """S_j = sum_{i < j} exp(1j * distance * theta_i) for j = 0 .. d/2 (S_0 = 0).

    The walk of d/2 unit steps in the complex plane whose lengths enter RoFormer's
    long-term-decay bound. Accepts an array of distances: the result has shape
    ``distance.shape + (d/2 + 1,)``, complex128.
    """
    head_dim = check_even_positive("head_dim", head_dim)
    theta = rope_thetas(head_dim, base)
    distance = np.asarray(distance, dtype=np.float64)
    steps = np.exp(1j * distance[..., None] * theta)
    zero = np.zeros(distance.shape + (1,), dtype=np.complex128)
    return np.concatenate([zero, np.cumsum(steps, axis=-1)], axis=-1)


def decay_upper_bound(distance, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """RoFormer's long-term-decay quantity (section 3.4.3).

    With S_j = sum_{i < j} exp(1j * distance * theta_i), the bound on the relative score is
    proportional to (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|. At distance 0 every term is 1, so the
    value is (d/2 + 1) / 2 (32.5 for d = 128).

    Args:
        distance: relative distance(s) m - n, scalar or array.
        head_dim: d (even).
        base: RoPE base.

    Returns:
        Array of the shape of ``distance``.
    """
    partial_sums = phasor_partial_sums(distance, head_dim, base)
    return np.abs(partial_sums[..., 1:]).mean(axis=-1)


def _pairs(name: str, x: object) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] == 0 or x.shape[-1] % 2:
        raise ValueError(f"{name} must have an even, non-zero last dimension (head_dim), "
                         f"got shape {x.shape}")
    return x[..., 0::2] + 1j * x[..., 1::2]


def relative_scores(q: object, k: object, distance: object, base: float = 10000.0) -> np.ndarray:
    """The RoPE score q^T R_{Theta,n-m} k of a query at m and a key at n = m - distance.

    q, k are in the interleaved layout (pairs (2i, 2i+1)), shape ``(..., head_dim)``,
    broadcast against each other; ``distance`` is a 1-D array of distances m - n.

    Returns:
        ``broadcast(q, k).shape[:-1] + (len(distance),)``, float64.
    """
    zq, zk = _pairs("q", q), _pairs("k", k)
    if zq.shape[-1] != zk.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {2 * zq.shape[-1]} "
                         f"and {2 * zk.shape[-1]}")
    distance = np.asarray(distance, dtype=np.float64)
    if distance.ndim != 1:
        raise ValueError(f"distance must be a 1-D array of distances, got shape {distance.shape}")
    theta = rope_thetas(2 * zq.shape[-1], base)
    h = zq * np.conj(zk)                                            # (..., d/2)
    phases = np.exp(1j * distance[:, None] * theta)                 # (D, d/2)
    return np.real(h @ phases.T)


def peaked_query_key(distance: float, head_dim: int, base: float = 10000.0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """A query and a key whose RoPE score is largest at the given distance.

    k has the unit vector (1, 0) in every pair; q is k turned back by ``distance``: pair i
    holds (cos(distance theta_i), -sin(distance theta_i)). Their score at distance D is
    sum_i cos((D - distance) theta_i), which reaches its maximum d/2 at D = distance.

    Returns:
        ``(q, k)``, each ``(head_dim,)`` float64, interleaved layout.
    """
    theta = rope_thetas(head_dim, base)
    k = np.zeros(head_dim)
    k[0::2] = 1.0
    q = np.empty(head_dim)
    q[0::2], q[1::2] = np.cos(distance * theta), -np.sin(distance * theta)
    return q, k


def first_negative_distance(base: float, max_distance: int, head_dim: int = 128) -> int | None:
    """The smallest distance m in 0 .. max_distance - 1 with B_m = sum_i cos(m theta_i) < 0,
    or None if there is none.

    B_m is Men et al.'s measure: up to a positive factor, how much more attention a key
    similar to the query gets than a random key at distance m. Distances are checked in
    blocks of doubling length, so an early failure is found cheaply.
    """
    max_distance = check_count("max_distance", max_distance)
    theta = rope_thetas(head_dim, base)
    start, block = 0, 64
    while start < max_distance:
        m = np.arange(start, min(start + block, max_distance), dtype=np.float64)
        negative = np.flatnonzero(np.cos(m[:, None] * theta).sum(axis=-1) < 0)
        if negative.size:
            return start + int(negative[0])
        start, block = start + block, 2 * block
    return None


def base_is_feasible(base: float, context_length: int, head_dim: int = 128) -> bool:
    """Men et al.'s condition on the base: B_m >= 0 for every distance m = 0 ..
    context_length - 1 inside the context (see :func:`first_negative_distance`)."""
    context_length = check_count("context_length", context_length)
    return first_negative_distance(base, context_length, head_dim) is None


def feasible_bases(bases: object, context_length: int, head_dim: int = 128) -> np.ndarray:
    """:func:`base_is_feasible` for every base of ``bases``, a boolean array of its shape."""
    bases = np.asarray(bases, dtype=np.float64)
    flags = [base_is_feasible(float(b), context_length, head_dim) for b in bases.ravel()]
    return np.array(flags, dtype=bool).reshape(bases.shape)


def first_feasible_base(bases: object, context_length: int, head_dim: int = 128
                        ) -> float | None:
    """The smallest base of the list ``bases`` that satisfies :func:`base_is_feasible`, or None.

    Every smaller base of the list fails the condition. This is a grid search (Men et al.
    search the grid (i + j/10) 10^x this way): the feasible set is not an interval, so a
    feasible base between two neighbours of the grid goes unseen; use
    :func:`smallest_feasible_base` for the bound itself.
    """
    for base in np.sort(np.asarray(bases, dtype=np.float64).ravel()):
        if base_is_feasible(float(base), context_length, head_dim):
            return float(base)
    return None


def smallest_feasible_base(context_length: int, head_dim: int = 128, *, start: float = 1000.0,
                           rtol: float = 1e-9, max_steps: int = 100_000) -> tuple[float, float]:
    """Men et al.'s lower bound on the base: the smallest base from ``start`` on with
    B_m = sum_i cos(m theta_i) >= 0 at every distance m = 0 .. context_length - 1, found by a
    scan that cannot step over a feasible base.

    The feasible bases do not form an interval (a feasible base can be followed by failing
    ones), so a bisection or a grid can miss the smallest. This scan moves up from ``start``
    in steps that skip failing bases only. If B_m(b) = -eps < 0 at some m >= 1, then, since
    every theta_i = b^(-2i/d) and 1/b shrink as the base grows, every b' >= b has

        |dB_m/db'| = |sum_i sin(m theta_i) m (2i/d) theta_i / b'| <= m c(b),
        c(b) = (1/b) sum_i (2i/d) theta_i(b),

    so B_m stays negative on [b, b + eps / (m c(b))). The scan takes the longest such step
    over the failing distances and stops on a base that passes. Near the bound the steps
    shrink geometrically; once a step is below ``rtol * b``, the base b (1 + rtol) is tested.
    Steps are computed from the most negative distances of the last full evaluation while
    they still give a step of at least ``rtol * b``, then from all distances again.

    Args:
        context_length: L; distances 0 .. L - 1 must have B_m >= 0.
        head_dim: d (even).
        start: the scan's first base (> 0).
        rtol: the relative width of the returned interval.
        max_steps: the most steps before giving up.

    Returns:
        ``(low, high)``: every base in [start, low) fails (to float64 precision), ``high``
        passes, and high is low or low (1 + rtol); low == high == start if ``start`` passes.

    Raises:
        RuntimeError: when ``max_steps`` steps reach no passing base.
    """
    context_length = check_count("context_length", context_length)
    check_even_positive("head_dim", head_dim)
    if not (isinstance(start, (int, float, np.floating)) and math.isfinite(start) and start > 0):
        raise ValueError(f"start must be a positive, finite base, got {start!r}")
    if not 0.0 < rtol < 1e-2:
        raise ValueError(f"rtol must be in (0, 0.01), got {rtol!r}")
    exponents = 2.0 * np.arange(head_dim // 2) / head_dim           # 2i/d
    distances = np.arange(1, context_length, dtype=np.float64)      # B_0 = d/2 > 0
    if distances.size == 0:
        return float(start), float(start)
    base, worst = float(start), distances[:0]
    for _ in range(max_steps):
        theta = base ** -exponents
        slope = float((exponents * theta).sum()) / base               # c(b)
        step = 0.0
        if worst.size:
            values = np.cos(worst[:, None] * theta).sum(axis=-1)
            step = float(np.max(-values / worst)) / slope
        if step < rtol * base:                                         # all distances again
            values = np.cos(distances[:, None] * theta).sum(axis=-1)
            if values.min() >= 0:
                return base, base
            worst = distances[np.argsort(values)[:256]]
            step = float(np.max(-values / distances)) / slope
            if step < rtol * base and base_is_feasible(base * (1 + rtol), context_length,
                                                       head_dim):
                return base, base * (1 + rtol)
        base += step
    raise RuntimeError(f"smallest_feasible_base: no passing base after {max_steps} steps "
                       f"(reached {base!r}, context_length={context_length}, "
                       f"head_dim={head_dim})")
