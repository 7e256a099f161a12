/* RoPE in one pass: each pair (a, b) of a row read once and written once, a' = a cos - b sin,
 * b' = a sin + b cos, in float32 for float32 and bfloat16 (rounded once), float64 for float64;
 * `inverse` reads sin as -sin (exact): the gradient. ropelib/native.py builds it and makes every
 * size and tile decision. Rows are the last dim (stride 1); other dims have a size and a stride
 * per tensor (0 where a table broadcasts): views need no copy. out is x or does not overlap it. */
#include <stdint.h>
#include <string.h>

/* x86-64 Linux GCC: a copy per instruction set, picked at load time; helpers forced inline (one
 * out of line would run its SSE2 build inside every copy). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define TARGETS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TARGETS
#endif
#define INLINE static inline __attribute__((always_inline))
/* In place (o == x) iteration i reads and writes only pair i: one loop vectorizes for both
 * (restrict x and o would make in place undefined; out never overlaps the restrict tables). */
#if defined(__clang__)
#define IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define IVDEP _Pragma("GCC ivdep")
#endif

INLINE float bits_f32(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
INLINE float bf16_load(uint16_t h) { return bits_f32((uint32_t)h << 16); }
/* Round to nearest even as torch does, every NaN to 0x7fc0; branch-free, so it vectorizes. */
INLINE uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(f != f ? 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#define SAME(v) (v)

/* A pair (p[0], p[1]) as (a, b) and back; bfloat16 as one 32-bit word: vectorizes better. */
#define PAIR_LOAD(ACC, LOAD, p, a, b) ACC a = LOAD((p)[0]), b = LOAD((p)[1])
#define PAIR_STORE(STORE, p, a, b) do { (p)[0] = STORE(a); (p)[1] = STORE(b); } while (0)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BF16_PAIR_LOAD(ACC, LOAD, p, a, b) uint32_t w_; memcpy(&w_, (p), 4);                       \
    ACC a = bits_f32(w_ << 16), b = bits_f32(w_ & 0xffff0000u)
#define BF16_PAIR_STORE(STORE, p, a, b) do {                                                       \
    uint32_t w_ = (uint32_t)STORE(a) | (uint32_t)STORE(b) << 16; memcpy((p), &w_, 4); } while (0)
#else
#define BF16_PAIR_LOAD PAIR_LOAD
#define BF16_PAIR_STORE PAIR_STORE
#endif

/* One dtype: half (i, i + h) and interleaved (2i, 2i + 1) row loops, the rows of units [begin,
 * end), the entry point that splits units over threads. `dims`: ndim leading sizes, then x's,
 * out's and the tables' strides. A unit is `tile` rows of seq at one index of the other dims,
 * run-major (all heads of one tile, then the next): tables broadcast over heads stay cached. */
#define DEFINE_ROPE(NAME, T, ACC, LOAD, STORE, PLOAD, PSTORE)                                     \
INLINE void NAME##_half(const T *x, T *o, const ACC *restrict c, const ACC *restrict s, ACC sign,  \
                        int64_t h) {                                                               \
    IVDEP for (int64_t i = 0; i < h; i++) {                                                        \
        ACC a = LOAD(x[i]), b = LOAD(x[i + h]), si = sign * s[i];                                  \
        o[i] = STORE(a * c[i] - b * si);                                                           \
        o[i + h] = STORE(a * si + b * c[i]);                                                       \
    }                                                                                              \
}                                                                                                  \
INLINE void NAME##_pairs(const T *x, T *o, const ACC *restrict c, const ACC *restrict s, ACC sign, \
                         int64_t h) {                                                              \
    IVDEP for (int64_t i = 0; i < h; i++) {                                                        \
        ACC si = sign * s[i];                                                                      \
        PLOAD(ACC, LOAD, x + 2 * i, a, b);                                                         \
        PSTORE(STORE, o + 2 * i, a * c[i] - b * si, a * si + b * c[i]);                            \
    }                                                                                              \
}                                                                                                  \
static TARGETS void NAME##_range(const T *x, T *out, const ACC *cos_t, const ACC *sin_t,           \
        const int64_t *dims, int64_t ndim, int64_t outer, int64_t head_dim, int64_t rotary_dim,    \
        int64_t half, ACC sign, int64_t tile, int64_t begin, int64_t end) {                        \
    const int64_t *sizes = dims, *xst = dims + ndim, *ost = dims + 2 * ndim;                       \
    const int64_t *tst = dims + 3 * ndim, last = ndim - 1, h = rotary_dim / 2;                     \
    const int64_t xs = xst[last], os = ost[last], ts = tst[last];                                  \
    for (int64_t u = begin; u < end; u++) {                                                        \
        const int64_t first = u / outer * tile;                                                    \
        const int64_t n = tile < sizes[last] - first ? tile : sizes[last] - first;                 \
        const T *xr = x + first * xs;                                                              \
        T *orow = out + first * os;                                                                \
        const ACC *c = cos_t + first * ts, *s = sin_t + first * ts;                                \
        for (int64_t d = last - 1, rest = u % outer; d >= 0; rest /= sizes[d--]) {                 \
            const int64_t i = rest % sizes[d];                                                     \
            xr += i * xst[d], orow += i * ost[d], c += i * tst[d], s += i * tst[d];                \
        }                                                                                          \
        for (int64_t j = 0; j < n; j++, xr += xs, orow += os, c += ts, s += ts) {                  \
            if (half) NAME##_half(xr, orow, c, s, sign, h);                                        \
            else NAME##_pairs(xr, orow, c, s, sign, h);                                            \
            if (orow != xr && rotary_dim < head_dim)                                               \
                memcpy(orow + rotary_dim, xr + rotary_dim,                                         \
                       (size_t)(head_dim - rotary_dim) * sizeof(T));                               \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
void NAME(const T *x, T *out, const ACC *cos_t, const ACC *sin_t, const int64_t *dims,             \
          int64_t ndim, int64_t tile, int64_t threads, int64_t head_dim, int64_t rotary_dim,       \
          int64_t half, int64_t inverse) {                                                         \
    int64_t outer = 1;                                                                             \
    for (int64_t d = 0; d + 1 < ndim; d++) outer *= dims[d];                                       \
    const int64_t units = (dims[ndim - 1] + tile - 1) / tile * outer;                              \
    if (threads > units) threads = units;                                                          \
    if (threads <= 1) /* no OpenMP region: it would cost as much as a small call */                \
        NAME##_range(x, out, cos_t, sin_t, dims, ndim, outer, head_dim, rotary_dim, half,          \
                     inverse ? -1 : 1, tile, 0, units);                                            \
    else                                                                                           \
        _Pragma("omp parallel for num_threads(threads) schedule(static, 1)")                       \
        for (int64_t t = 0; t < threads; t++)                                                      \
            NAME##_range(x, out, cos_t, sin_t, dims, ndim, outer, head_dim, rotary_dim, half,      \
                         inverse ? -1 : 1, tile, units * t / threads, units * (t + 1) / threads);  \
}
DEFINE_ROPE(rope_float32, float, float, SAME, SAME, PAIR_LOAD, PAIR_STORE)
DEFINE_ROPE(rope_float64, double, double, SAME, SAME, PAIR_LOAD, PAIR_STORE)
DEFINE_ROPE(rope_bfloat16, uint16_t, float, bf16_load, bf16_store, BF16_PAIR_LOAD, BF16_PAIR_STORE)

#if defined(_OPENMP)
int rope_threaded(void) { return 1; }
#else
int rope_threaded(void) { return 0; }
#endif
