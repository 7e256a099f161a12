/* RoPE as one pass over memory: every pair (a, b) of a row is read once and written once,
 *
 *     a' = a cos(m theta_i) - b sin(m theta_i)
 *     b' = a sin(m theta_i) + b cos(m theta_i),
 *
 * in float32 arithmetic for float32 and bfloat16 (rounded once on the way out) and in
 * float64 for float64; `inverse` rotates by -theta instead (sin read as -sin, exactly), which
 * is the gradient. Compiled on first use by ropelib/native.py and called through ctypes.
 *
 * x, out and the tables are addressed as "rows" of channels (the last dim, stride 1); every
 * other dim is described by its size and a stride per tensor (a table's stride is 0 along
 * the dims it broadcasts over), so transposed views such as q.transpose(1, 2) need no copy.
 * out is either x itself (in place: each pair is read before it is written) or memory that
 * does not overlap x; ropelib checks this before calling. The rows, in tiles that keep the
 * tables' rows in the cache across heads (DEFINE_RANGE), are split into `threads` ranges run by
 * OpenMP, sharing the thread pool PyTorch already runs. For multi-axis RoPE whose pairs each
 * follow one axis (M-RoPE), rope_*_axes reads each token's rows from the 1D tables through
 * its coordinates inside the loop, and rope_axis_rows_* gathers them into tensors.
 */
#include <stdint.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define ROPE_MAX_DIMS 8

/* One compiled copy per instruction set, chosen by the CPU at load time (x86-64 Linux GCC).
 * Only the function marked is cloned, so every helper it calls is forced inline: a helper
 * left out of line would run its baseline (SSE2) build inside the AVX clones. The rotation's
 * loops have an AVX-512 copy of their own (ROPE_WIDE, chosen per call by rope_wide()), since
 * its bfloat16 blocks are written in 64-byte vectors, which the AVX2 build would split badly,
 * and a copy per narrower instruction set (ROPE_NARROW_TARGETS). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define ROPE_TARGETS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define ROPE_NARROW_TARGETS __attribute__((target_clones("arch=x86-64-v3", "default")))
#define ROPE_WIDE_TARGET __attribute__((target("arch=x86-64-v4")))
#define ROPE_WIDE 1
#else
#define ROPE_TARGETS
#define ROPE_NARROW_TARGETS
#endif
#if defined(__GNUC__)
#define ROPE_INLINE static inline __attribute__((always_inline))
#else
#define ROPE_INLINE static inline
#endif

ROPE_INLINE float bf16_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

ROPE_INLINE float bf16_load(uint16_t h) { return bf16_bits((uint32_t)h << 16); }

/* Round to nearest even, as torch does; every NaN becomes the quiet NaN 0x7fc0. Branch-free,
 * so it vectorizes. */
ROPE_INLINE uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? 0x7fc0u : rounded);
}

#define SAME(v) (v)

/* An interleaved pair (x[2i], x[2i+1]) to (a, b) and back. Element by element for float32 and
 * float64; for bfloat16 as one 32-bit word, which lets the compiler vectorize the loop without
 * shuffling 16-bit lanes (the low half is x[2i] on a little-endian machine). */
#define PAIR_LOAD(ACC, LOAD, p, a, b) ACC a = LOAD((p)[0]), b = LOAD((p)[1])
#define PAIR_STORE(STORE, p, a, b) do { (p)[0] = STORE(a); (p)[1] = STORE(b); } while (0)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BF16_PAIR_LOAD(ACC, LOAD, p, a, b)                                                      \
    uint32_t word_in;                                                                           \
    memcpy(&word_in, (p), 4);                                                                   \
    ACC a = bf16_bits(word_in << 16), b = bf16_bits(word_in & 0xffff0000u)
#define BF16_PAIR_STORE(STORE, p, a, b)                                                         \
    do {                                                                                        \
        uint32_t word_ = (uint32_t)STORE(a) | (uint32_t)STORE(b) << 16;                        \
        memcpy((p), &word_, 4);                                                                 \
    } while (0)
#else
#define BF16_PAIR_LOAD PAIR_LOAD
#define BF16_PAIR_STORE PAIR_STORE
#endif

/* The first pairs of an interleaved row done in blocks of 8, returning how many were done (the
 * caller's scalar loop does the rest). A compiler vectorizes half rows by itself, but for
 * interleaved float32 it shuffles badly; here two vectors [a0 b0 a1 b1 ...] are split into
 * a = (a0 a1 a4 a5 a2 a3 a6 a7) and b alike (in-lane shuffles), the tables are permuted to the
 * same order, and unpacking a', b' restores the interleaved order. Same arithmetic as the
 * scalar loop, so the same bits; every block is read before it is written, so out may be x. */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define ROPE_VECTOR_BLOCKS 1
#endif
#endif
#if defined(ROPE_VECTOR_BLOCKS)
typedef float f32x8 __attribute__((vector_size(32)));

ROPE_INLINE int64_t f32_interleaved_blocks(const float *x, float *o, const float *c,
                                           const float *s, float sign, int64_t h) {
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
        f32x8 v0, v1, c8, s8;
        memcpy(&v0, x + 2 * i, sizeof v0);
        memcpy(&v1, x + 2 * i + 8, sizeof v1);
        memcpy(&c8, c + i, sizeof c8);
        memcpy(&s8, s + i, sizeof s8);
        f32x8 a = __builtin_shufflevector(v0, v1, 0, 2, 8, 10, 4, 6, 12, 14);
        f32x8 b = __builtin_shufflevector(v0, v1, 1, 3, 9, 11, 5, 7, 13, 15);
        f32x8 cp = __builtin_shufflevector(c8, c8, 0, 1, 4, 5, 2, 3, 6, 7);
        f32x8 sp = __builtin_shufflevector(s8, s8, 0, 1, 4, 5, 2, 3, 6, 7) * sign;
        f32x8 na = a * cp - b * sp, nb = a * sp + b * cp;
        v0 = __builtin_shufflevector(na, nb, 0, 8, 1, 9, 4, 12, 5, 13);
        v1 = __builtin_shufflevector(na, nb, 2, 10, 3, 11, 6, 14, 7, 15);
        memcpy(o + 2 * i, &v0, sizeof v0);
        memcpy(o + 2 * i + 8, &v1, sizeof v1);
    }
    return i;
}
#define F32_BLOCKS f32_interleaved_blocks

/* The first pairs of a bfloat16 half row done in blocks of 16: the 16 values of a (and of b)
 * widen to two float32 vectors by interleaving zeros below them, which puts the pairs in the
 * order (0-3, 8-11) and (4-7, 12-15), the tables are read in that order too, and picking the
 * high 16 bits of the rounded results restores the order. The same rounding as bf16_store, on
 * all 32 bits: add 0x7fff plus the lowest kept bit, NaNs to 0x7fc0. So the same bits as the
 * scalar loop, and out may be x. */
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* Float32 bit patterns (vectors of words) rounded to bfloat16 in their high 16 bits, as
 * bf16_store rounds: add 0x7fff plus the lowest kept bit; where `nan` is set, 0x7fc0. */
#define BF16_ROUND_WORDS(u, nan) ((((u) + 0x7fffu + (((u) >> 16) & 1u)) & ~(nan)) \
                                  | (0x7fc00000u & (nan)))

/* o[0..15] = the 16 results in lo (pairs 0-3, 8-11) and hi (4-7, 12-15), rounded to bfloat16.
 * Vectors are passed by address: as arguments they would change the ABI between the builds. */
ROPE_INLINE void bf16_round_store(uint16_t *o, const f32x8 *lo, const f32x8 *hi) {
    u32x8 u = (u32x8)*lo, v = (u32x8)*hi;
    u32x8 nan_u = (u32x8)(*lo != *lo), nan_v = (u32x8)(*hi != *hi);
    u = BF16_ROUND_WORDS(u, nan_u);
    v = BF16_ROUND_WORDS(v, nan_v);
    u16x16 packed = __builtin_shufflevector((u16x16)u, (u16x16)v, 1, 3, 5, 7, 17, 19, 21, 23,
                                            9, 11, 13, 15, 25, 27, 29, 31);
    memcpy(o, &packed, sizeof packed);
}

ROPE_INLINE int64_t bf16_half_blocks(const uint16_t *x, uint16_t *o, const float *c,
                                     const float *s, float sign, int64_t h) {
    const u16x16 zero = {0};
    int64_t i = 0;
    for (; i + 16 <= h; i += 16) {
        u16x16 va, vb;
        f32x8 c0, c1, s0, s1;
        memcpy(&va, x + i, sizeof va);
        memcpy(&vb, x + i + h, sizeof vb);
        memcpy(&c0, c + i, sizeof c0);
        memcpy(&c1, c + i + 8, sizeof c1);
        memcpy(&s0, s + i, sizeof s0);
        memcpy(&s1, s + i + 8, sizeof s1);
        s0 *= sign;
        s1 *= sign;
        f32x8 a0 = (f32x8)__builtin_shufflevector(zero, va, 0, 16, 1, 17, 2, 18, 3, 19,
                                                  8, 24, 9, 25, 10, 26, 11, 27);
        f32x8 a1 = (f32x8)__builtin_shufflevector(zero, va, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  12, 28, 13, 29, 14, 30, 15, 31);
        f32x8 b0 = (f32x8)__builtin_shufflevector(zero, vb, 0, 16, 1, 17, 2, 18, 3, 19,
                                                  8, 24, 9, 25, 10, 26, 11, 27);
        f32x8 b1 = (f32x8)__builtin_shufflevector(zero, vb, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  12, 28, 13, 29, 14, 30, 15, 31);
        f32x8 cp0 = __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11);
        f32x8 cp1 = __builtin_shufflevector(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
        f32x8 sp0 = __builtin_shufflevector(s0, s1, 0, 1, 2, 3, 8, 9, 10, 11);
        f32x8 sp1 = __builtin_shufflevector(s0, s1, 4, 5, 6, 7, 12, 13, 14, 15);
        f32x8 na0 = a0 * cp0 - b0 * sp0, na1 = a1 * cp1 - b1 * sp1;
        f32x8 nb0 = a0 * sp0 + b0 * cp0, nb1 = a1 * sp1 + b1 * cp1;
        bf16_round_store(o + i, &na0, &na1);
        bf16_round_store(o + i + h, &nb0, &nb1);
    }
    return i;
}
#define BF16_HALF_BLOCKS bf16_half_blocks

/* The same in blocks of 32 pairs for the AVX-512 build (ROPE_WIDE), in 64-byte vectors and
 * without moving a lane of x: the 32 values of a (and of b) are read as 16 32-bit words,
 * whose low halves are the even pairs and high halves the odd ones, so a shift and a mask
 * widen them to float32; the tables are split into their even and odd entries to match, and
 * the rounded results go back into the halves of the words. Same arithmetic and rounding,
 * so the same bits, and out may be x. */
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

/* Words from the results for the pairs' low (even) and high (odd) 16 bits, each rounded to
 * bfloat16 as bf16_store does. Vectors by address, as above. */
ROPE_INLINE void bf16_round_pack(u32x16 *o, const f32x16 *even, const f32x16 *odd) {
    u32x16 u = (u32x16)*even, v = (u32x16)*odd;
    u32x16 nan_u = (u32x16)(*even != *even), nan_v = (u32x16)(*odd != *odd);
    u = BF16_ROUND_WORDS(u, nan_u);
    v = BF16_ROUND_WORDS(v, nan_v);
    *o = (u >> 16) | (v & 0xffff0000u);
}

#define EVEN16 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define ODD16 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
ROPE_INLINE int64_t bf16_half_blocks_wide(const uint16_t *x, uint16_t *o, const float *c,
                                          const float *s, float sign, int64_t h) {
    int64_t i = 0;
    for (; i + 32 <= h; i += 32) {
        u32x16 wa, wb, ra, rb;
        f32x16 c0, c1, s0, s1;
        memcpy(&wa, x + i, sizeof wa);
        memcpy(&wb, x + i + h, sizeof wb);
        memcpy(&c0, c + i, sizeof c0);
        memcpy(&c1, c + i + 16, sizeof c1);
        memcpy(&s0, s + i, sizeof s0);
        memcpy(&s1, s + i + 16, sizeof s1);
        f32x16 ae = (f32x16)(wa << 16), ao = (f32x16)(wa & 0xffff0000u);
        f32x16 be = (f32x16)(wb << 16), bo = (f32x16)(wb & 0xffff0000u);
        f32x16 ce = __builtin_shufflevector(c0, c1, EVEN16);
        f32x16 co = __builtin_shufflevector(c0, c1, ODD16);
        f32x16 se = __builtin_shufflevector(s0, s1, EVEN16) * sign;
        f32x16 so = __builtin_shufflevector(s0, s1, ODD16) * sign;
        f32x16 nae = ae * ce - be * se, nao = ao * co - bo * so;
        f32x16 nbe = ae * se + be * ce, nbo = ao * so + bo * co;
        bf16_round_pack(&ra, &nae, &nao);
        bf16_round_pack(&rb, &nbe, &nbo);
        memcpy(o + i, &ra, sizeof ra);
        memcpy(o + i + h, &rb, sizeof rb);
    }
    return i;
}
#define BF16_HALF_BLOCKS_WIDE bf16_half_blocks_wide
#else
#define F32_BLOCKS NO_BLOCKS
#define BF16_HALF_BLOCKS NO_BLOCKS
#define BF16_HALF_BLOCKS_WIDE NO_BLOCKS
#endif
#define NO_BLOCKS(x, o, c, s, sign, h) 0

/* The pair loops of one row, for `half` pairs (i, i + h) and `interleaved` pairs (2i, 2i + 1):
 * out of place (restrict: out does not overlap x) and in place; HBLOCKS and IBLOCKS do a
 * prefix of a half and of an interleaved row. `sign` is 1 for R_Theta and -1 for its inverse
 * R_{-Theta} (sin negated: the gradient), exact either way. */
#define DEFINE_ROWS(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS)                \
ROPE_INLINE void NAME##_half(const T *restrict x, T *restrict o, const ACC *restrict c,        \
                             const ACC *restrict s, ACC sign, int64_t h) {                     \
    for (int64_t i = HBLOCKS(x, o, c, s, sign, h); i < h; i++) {                               \
        ACC a = LOAD(x[i]), b = LOAD(x[i + h]), si = sign * s[i];                              \
        o[i] = STORE(a * c[i] - b * si);                                                       \
        o[i + h] = STORE(a * si + b * c[i]);                                                   \
    }                                                                                          \
}                                                                                              \
ROPE_INLINE void NAME##_half_in_place(T *x, const ACC *restrict c, const ACC *restrict s,      \
                                      ACC sign, int64_t h) {                                   \
    for (int64_t i = HBLOCKS(x, x, c, s, sign, h); i < h; i++) {                               \
        ACC a = LOAD(x[i]), b = LOAD(x[i + h]), si = sign * s[i];                              \
        x[i] = STORE(a * c[i] - b * si);                                                       \
        x[i + h] = STORE(a * si + b * c[i]);                                                   \
    }                                                                                          \
}                                                                                              \
ROPE_INLINE void NAME##_interleaved(const T *restrict x, T *restrict o, const ACC *restrict c, \
                                    const ACC *restrict s, ACC sign, int64_t h) {              \
    for (int64_t i = IBLOCKS(x, o, c, s, sign, h); i < h; i++) {                               \
        ACC si = sign * s[i];                                                                  \
        PLOAD(ACC, LOAD, x + 2 * i, a, b);                                                     \
        PSTORE(STORE, o + 2 * i, a * c[i] - b * si, a * si + b * c[i]);                        \
    }                                                                                          \
}                                                                                              \
ROPE_INLINE void NAME##_interleaved_in_place(T *x, const ACC *restrict c,                      \
                                             const ACC *restrict s, ACC sign, int64_t h) {     \
    for (int64_t i = IBLOCKS(x, x, c, s, sign, h); i < h; i++) {                               \
        ACC si = sign * s[i];                                                                  \
        PLOAD(ACC, LOAD, x + 2 * i, a, b);                                                     \
        PSTORE(STORE, x + 2 * i, a * c[i] - b * si, a * si + b * c[i]);                        \
    }                                                                                          \
}

/* Rows of the tensor in tiles: the innermost leading dim (usually seq) is cut into runs of
 * `tile` rows, and a unit of work is one run at one index of the other leading dims. Units
 * go run-major: all heads (and batches) of rows [0, tile), then of [tile, 2 tile), ..., so a
 * table that is broadcast over heads is read from a cache for every head after the first
 * instead of from memory (the rows of a bfloat16 x are half the bytes of their float32
 * tables). A run is a whole seq where its tables fit in a cache (rope_tile_rows), and then
 * the units walk a contiguous x and out in memory order. Units [begin, end) are
 * done here; `index` is the position in the other leading dims, advanced like an odometer
 * once per unit, with the element offsets of x, out and the tables kept alongside. A 1-D x
 * (ndim 0) is one unit of one row.
 *
 * With `positions` (multi-axis RoPE whose pairs each follow one axis, as M-RoPE), the tables
 * are 1-D, (table_len, h) contiguous, and `table_strides` step through the positions instead
 * (int64 elements, k coordinates per row): pair i of a row at coordinates p reads table row
 * p[axes[i]]. A run's rows are gathered once into `gathered` and reused while the positions
 * stay the same (across heads); a row whose coordinates are all equal (text on the diagonal)
 * is read from the table itself. A coordinate outside [0, table_len) stops the range with -1
 * (its rows incomplete); otherwise the result is 0. */
#define DEFINE_RANGE(NAME, T, ACC, TARGETS)                                                    \
static TARGETS int64_t NAME##_range(                                                           \
        const T *x, T *out, const ACC *cos_t, const ACC *sin_t, int64_t begin, int64_t end,    \
        int64_t ndim, const int64_t *sizes, const int64_t *x_strides,                          \
        const int64_t *out_strides, const int64_t *table_strides, int64_t head_dim,            \
        int64_t rotary_dim, int64_t half_layout, ACC sign, int64_t tile,                       \
        const int64_t *positions, const int32_t *axes, int64_t k, int64_t table_len) {         \
    const int64_t last = ndim - 1, run_size = ndim ? sizes[last] : 1;                          \
    const int64_t xs = ndim ? x_strides[last] : 0, os = ndim ? out_strides[last] : 0;          \
    const int64_t ts = ndim ? table_strides[last] : 0;                                         \
    int64_t outer = 1;                                                                         \
    for (int64_t d = 0; d < last; d++) outer *= sizes[d];                                      \
    int64_t index[ROPE_MAX_DIMS], xo = 0, oo = 0, to = 0, run = begin / outer;                 \
    int64_t rest = begin % outer;                                                              \
    for (int64_t d = last - 1; d >= 0; d--) {                                                  \
        index[d] = rest % sizes[d];                                                            \
        rest /= sizes[d];                                                                      \
        xo += index[d] * x_strides[d];                                                         \
        oo += index[d] * out_strides[d];                                                       \
        to += index[d] * table_strides[d];                                                     \
    }                                                                                          \
    const int64_t h = rotary_dim / 2;                                                          \
    ACC gathered[ROPE_TILE_BYTES / sizeof(ACC)];                                               \
    const ACC *row_c[ROPE_TILE_BYTES / 8], *row_s[ROPE_TILE_BYTES / 8];                        \
    const int64_t *gathered_for = NULL;                                                        \
    for (int64_t u = begin; u < end; u++) {                                                    \
        const int64_t first = run * tile;                                                      \
        const int64_t n = tile < run_size - first ? tile : run_size - first;                   \
        const T *xr = x + xo + first * xs;                                                     \
        T *orow = out + oo + first * os;                                                       \
        if (positions) {                                                                       \
            const int64_t *p = positions + to + first * ts;                                    \
            if (p != gathered_for) {                                                           \
                for (int64_t j = 0; j < n; j++, p += ts) {                                     \
                    int64_t diagonal = 1;                                                      \
                    for (int64_t a = 0; a < k; a++) {                                          \
                        if (p[a] < 0 || p[a] >= table_len) return -1;                          \
                        diagonal &= p[a] == p[0];                                              \
                    }                                                                          \
                    if (diagonal) {                                                            \
                        row_c[j] = cos_t + p[0] * h;                                           \
                        row_s[j] = sin_t + p[0] * h;                                           \
                        continue;                                                              \
                    }                                                                          \
                    ACC *restrict gc = gathered + 2 * j * h, *restrict gs = gc + h;            \
                    for (int64_t i = 0; i < h; i++) {                                          \
                        gc[i] = cos_t[p[axes[i]] * h + i];                                     \
                        gs[i] = sin_t[p[axes[i]] * h + i];                                     \
                    }                                                                          \
                    row_c[j] = gc;                                                             \
                    row_s[j] = gs;                                                             \
                }                                                                              \
                gathered_for = positions + to + first * ts;                                    \
            }                                                                                  \
        }                                                                                      \
        const ACC *c = cos_t + to + first * ts, *s = sin_t + to + first * ts;                  \
        for (int64_t j = 0; j < n; j++, xr += xs, orow += os, c += ts, s += ts) {              \
            const ACC *cj = positions ? row_c[j] : c, *sj = positions ? row_s[j] : s;          \
            if (orow == xr) {                                                                  \
                if (half_layout) NAME##_half_in_place(orow, cj, sj, sign, h);                  \
                else NAME##_interleaved_in_place(orow, cj, sj, sign, h);                       \
                continue;                                                                      \
            }                                                                                  \
            if (half_layout) NAME##_half(xr, orow, cj, sj, sign, h);                           \
            else NAME##_interleaved(xr, orow, cj, sj, sign, h);                                \
            if (rotary_dim < head_dim)                                                         \
                memcpy(orow + rotary_dim, xr + rotary_dim,                                     \
                       (size_t)(head_dim - rotary_dim) * sizeof(T));                           \
        }                                                                                      \
        int64_t d = last - 1;                                                                  \
        for (; d >= 0; d--) {                                                                  \
            xo += x_strides[d];                                                                \
            oo += out_strides[d];                                                              \
            to += table_strides[d];                                                            \
            if (++index[d] < sizes[d]) break;                                                  \
            xo -= index[d] * x_strides[d];                                                     \
            oo -= index[d] * out_strides[d];                                                   \
            to -= index[d] * table_strides[d];                                                 \
            index[d] = 0;                                                                      \
        }                                                                                      \
        if (d < 0) run++;                                                                      \
    }                                                                                          \
    return 0;                                                                                  \
}

/* The rows of a tile, `row_bytes` being the bytes of one row of cos and sin and `outer` the
 * number of runs of each row index (batch x heads). Where the tables of a whole run take at
 * most ROPE_TABLE_CACHE_BYTES they can stay in the last-level cache while every head reads
 * them, so the tile is the whole run and a contiguous x and out are read and written as one
 * stream in memory order, which the processor fetches ahead best: at (4, 16, 2048, 128), one
 * thread of an AMD EPYC, this took about 0.8 of the time of tiles of 16 KiB of table rows
 * (float32 x read in pieces 1 MiB apart) in float32 and about 0.6 in bfloat16, and where x
 * fits in the cache about the same (bfloat16 up to 5% more, its tables now read from the
 * second-level cache, not the first): benchmarks/results/2026-11-26-cpu-1thread-tiles.txt.
 * Larger tables go in tiles of ROPE_TABLE_TILE_BYTES (a second-level cache), which still leave
 * x in pieces long enough to stream. Gathered M-RoPE rows (`gathered`) hold ROPE_TILE_BYTES.
 * With OpenMP, runs are then cut into tiles of 1/n of a run, n chosen for ROPE_UNITS_PER_THREAD
 * units per thread, so that, where the rows allow, the threads' shares of units differ by a
 * quarter at most (with whole runs, 6 runs on 4 threads would be 2, 1, 2, 1). Exported for
 * the tests. */
#define ROPE_TILE_BYTES 16384
#define ROPE_TABLE_CACHE_BYTES (4 << 20)
#define ROPE_TABLE_TILE_BYTES (256 << 10)
#define ROPE_UNITS_PER_THREAD 4
int64_t rope_tile_rows(int64_t run_size, int64_t outer, int64_t row_bytes, int64_t gathered,
                       int64_t threads) {
    if (run_size < 1 || outer < 1 || row_bytes < 1) return run_size > 1 ? run_size : 1;
    int64_t tile = gathered ? ROPE_TILE_BYTES / row_bytes
                 : run_size * row_bytes <= ROPE_TABLE_CACHE_BYTES ? run_size
                 : ROPE_TABLE_TILE_BYTES / row_bytes;
    if (tile < 1 || tile > run_size) tile = run_size;
#if defined(_OPENMP)
    const int64_t wanted = ROPE_UNITS_PER_THREAD * threads;
    if (threads > 1 && outer * ((run_size + tile - 1) / tile) < wanted) {
        const int64_t runs = (wanted + outer - 1) / outer;
        tile = (run_size + runs - 1) / runs;
    }
#else
    (void)threads;
#endif
    return tile;
}

/* The entry points: all rows of x, split over `threads` threads. `dims` holds, for the ndim
 * leading dims, their sizes, then x's strides, out's strides and the tables' strides (of the
 * positions for NAME##_axes). Tiles as rope_tile_rows says (a whole run when the tables do
 * not change along it). NAME##_axes returns 0, or -1 when an axis is not in [0, k), a
 * coordinate not in [0, table_len) (then out is incomplete) or a gathered row would not fit
 * in a tile (rotary_dim * sizeof(ACC) > ROPE_TILE_BYTES). */
#if defined(ROPE_WIDE)
#define DEFINE_WIDE(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS)                \
DEFINE_ROWS(NAME##_wide, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS)                 \
DEFINE_RANGE(NAME##_wide, T, ACC, ROPE_WIDE_TARGET)
#define WIDE_OR(NAME) (rope_wide() ? NAME##_wide_range : NAME##_range)

/* Whether this CPU runs the AVX-512 build (x86-64-v4: AVX512F, BW, CD, DQ and VL). */
static int rope_wide(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512vl");
}
#else
#define DEFINE_WIDE(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS)
#define WIDE_OR(NAME) NAME##_range
#endif
#define DEFINE_ROPE(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS, WIDE_HBLOCKS)  \
DEFINE_ROWS(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, HBLOCKS, IBLOCKS)                        \
DEFINE_RANGE(NAME, T, ACC, ROPE_NARROW_TARGETS)                                                \
DEFINE_WIDE(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE, WIDE_HBLOCKS, IBLOCKS)                   \
int64_t NAME##_axes(const T *x, T *out, const ACC *cos_t, const ACC *sin_t, int64_t threads,   \
                    int64_t ndim, const int64_t *dims, int64_t head_dim, int64_t rotary_dim,   \
                    int64_t half_layout, int64_t inverse, const int64_t *positions,            \
                    const int32_t *axes, int64_t k, int64_t table_len) {                       \
    const int64_t *sizes = dims, *x_strides = dims + ndim, *out_strides = dims + 2 * ndim;     \
    const int64_t *table_strides = dims + 3 * ndim;                                            \
    const ACC sign = inverse ? -1 : 1;                                                         \
    const int64_t run_size = ndim ? sizes[ndim - 1] : 1;                                       \
    if (positions) {                                                                           \
        if (rotary_dim * (int64_t)sizeof(ACC) > ROPE_TILE_BYTES) return -1;                    \
        for (int64_t i = 0; i < rotary_dim / 2; i++)                                           \
            if (axes[i] < 0 || axes[i] >= k) return -1;                                        \
    }                                                                                          \
    int64_t outer = 1;                                                                         \
    for (int64_t d = 0; d + 1 < ndim; d++) outer *= sizes[d];                                  \
    const int64_t row_bytes = rotary_dim > 0 ? rotary_dim * (int64_t)sizeof(ACC) : 1;         \
    int64_t tile = !ndim || (!positions && !table_strides[ndim - 1]) ? run_size                \
                 : rope_tile_rows(run_size, outer, row_bytes, positions != NULL, threads);     \
    int64_t units = (run_size + tile - 1) / tile * outer;                                      \
    if (threads > units) threads = units;                                                      \
    int64_t (*range)(const T *, T *, const ACC *, const ACC *, int64_t, int64_t, int64_t,      \
                     const int64_t *, const int64_t *, const int64_t *, const int64_t *,       \
                     int64_t, int64_t, int64_t, ACC, int64_t, const int64_t *,                 \
                     const int32_t *, int64_t, int64_t) = WIDE_OR(NAME);                       \
    if (threads <= 1)                                                                          \
        return range(x, out, cos_t, sin_t, 0, units, ndim, sizes, x_strides,            \
                            out_strides, table_strides, head_dim, rotary_dim, half_layout,     \
                            sign, tile, positions, axes, k, table_len);                        \
    int64_t status = 0;                                                                        \
    _Pragma("omp parallel for num_threads(threads) schedule(static, 1) reduction(|:status)")   \
    for (int64_t t = 0; t < threads; t++)                                                      \
        status |= range(x, out, cos_t, sin_t, units * t / threads,                             \
                               units * (t + 1) / threads, ndim, sizes, x_strides,              \
                               out_strides, table_strides, head_dim, rotary_dim, half_layout,  \
                               sign, tile, positions, axes, k, table_len);                     \
    return status;                                                                             \
}                                                                                              \
void NAME(const T *x, T *out, const ACC *cos_t, const ACC *sin_t, int64_t threads,             \
          int64_t ndim, const int64_t *dims, int64_t head_dim, int64_t rotary_dim,             \
          int64_t half_layout, int64_t inverse) {                                              \
    NAME##_axes(x, out, cos_t, sin_t, threads, ndim, dims, head_dim, rotary_dim, half_layout,  \
                inverse, NULL, NULL, 0, 0);                                                    \
}

int64_t rope_max_dims(void) { return ROPE_MAX_DIMS; }

int64_t rope_tile_bytes(void) { return ROPE_TILE_BYTES; }

int64_t rope_table_cache_bytes(void) { return ROPE_TABLE_CACHE_BYTES; }

int64_t rope_table_tile_bytes(void) { return ROPE_TABLE_TILE_BYTES; }

/* Whether this build runs its threads (compiled with OpenMP) or runs the ranges in turn. */
int64_t rope_threaded(void) {
#if defined(_OPENMP)
    return 1;
#else
    return 0;
#endif
}

DEFINE_ROPE(rope_float32, float, float, SAME, SAME, PAIR_LOAD, PAIR_STORE, NO_BLOCKS, F32_BLOCKS,
            NO_BLOCKS)
DEFINE_ROPE(rope_float64, double, double, SAME, SAME, PAIR_LOAD, PAIR_STORE, NO_BLOCKS, NO_BLOCKS,
            NO_BLOCKS)
DEFINE_ROPE(rope_bfloat16, uint16_t, float, bf16_load, bf16_store, BF16_PAIR_LOAD, BF16_PAIR_STORE,
            BF16_HALF_BLOCKS, NO_BLOCKS, BF16_HALF_BLOCKS_WIDE)

/* Multi-axis RoPE's rows when every pair follows one axis (M-RoPE): pair i of token n is
 * read from the row of that axis' coordinate, cos_out[n, i] = cos_t[positions[n, axes[i]], i]
 * (sin alike), for `tokens` tokens of k coordinates and tables of `table_len` rows of `pairs`
 * columns, all contiguous. The row of axis 0 is copied, then each other axis' row is blended
 * in where axes[i] is that axis: whole rows, in the cache, instead of one index per element.
 * Every index is checked before it is read: the result is 0, or -1 when an axis is not in
 * [0, k) or a position not in [0, table_len) (the rows are then incomplete). */
#define DEFINE_AXIS_ROWS(NAME, ACC)                                                            \
static ROPE_TARGETS int64_t NAME##_range(const ACC *cos_t, const ACC *sin_t,                   \
                                         const int64_t *positions, const int32_t *axes,        \
                                         int64_t k, int64_t table_len, int64_t pairs,          \
                                         ACC *cos_out, ACC *sin_out, int64_t begin,            \
                                         int64_t end) {                                        \
    for (int64_t n = begin; n < end; n++) {                                                    \
        const int64_t *p = positions + n * k;                                                  \
        for (int64_t a = 0; a < k; a++)                                                        \
            if (p[a] < 0 || p[a] >= table_len) return -1;                                      \
        ACC *restrict co = cos_out + n * pairs, *restrict so = sin_out + n * pairs;            \
        const ACC *restrict c = cos_t + p[0] * pairs, *restrict s = sin_t + p[0] * pairs;      \
        for (int64_t i = 0; i < pairs; i++) {                                                  \
            co[i] = c[i];                                                                      \
            so[i] = s[i];                                                                      \
        }                                                                                      \
        for (int64_t a = 1; a < k; a++) {                                                      \
            c = cos_t + p[a] * pairs;                                                          \
            s = sin_t + p[a] * pairs;                                                          \
            for (int64_t i = 0; i < pairs; i++) {                                              \
                const int take = axes[i] == a;                                                 \
                co[i] = take ? c[i] : co[i];                                                   \
                so[i] = take ? s[i] : so[i];                                                   \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    return 0;                                                                                  \
}                                                                                              \
int64_t NAME(const ACC *cos_t, const ACC *sin_t, const int64_t *positions,                     \
             const int32_t *axes, int64_t tokens, int64_t k, int64_t table_len, int64_t pairs, \
             ACC *cos_out, ACC *sin_out, int64_t threads) {                                    \
    for (int64_t i = 0; i < pairs; i++)                                                        \
        if (axes[i] < 0 || axes[i] >= k) return -1;                                            \
    if (threads > tokens) threads = tokens;                                                    \
    if (threads <= 1)                                                                          \
        return NAME##_range(cos_t, sin_t, positions, axes, k, table_len, pairs, cos_out,       \
                            sin_out, 0, tokens);                                               \
    int64_t status = 0;                                                                        \
    _Pragma("omp parallel for num_threads(threads) schedule(static, 1) reduction(|:status)")   \
    for (int64_t t = 0; t < threads; t++)                                                      \
        status |= NAME##_range(cos_t, sin_t, positions, axes, k, table_len, pairs, cos_out,    \
                               sin_out, tokens * t / threads, tokens * (t + 1) / threads);     \
    return status;                                                                             \
}

DEFINE_AXIS_ROWS(rope_axis_rows_float32, float)
DEFINE_AXIS_ROWS(rope_axis_rows_float64, double)

/* Ask for transparent huge pages on the 2 MiB-aligned part of a fresh buffer, before it is
 * first touched: one page fault per 2 MiB instead of per 4 KiB. Advice only; 0 on success. */
int rope_advise_huge_pages(void *start, int64_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)1 << 21;
    uintptr_t begin = ((uintptr_t)start + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)start + (uintptr_t)nbytes) & ~(huge - 1);
    if (end <= begin) return 0;
    return madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
    (void)start;
    (void)nbytes;
    return -1;
#endif
}
