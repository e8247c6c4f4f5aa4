//! Attention of one new position over a sequence's K/V, on plain slices: what a decode step
//! computes per sequence, layer and head.
//!
//! Through candle's tensor operations this was a dozen small operations (narrow, copy, two
//! matmuls that pack their operands, scale, softmax, reshape) per sequence and layer: one
//! sequence's step spent 5.9 ms of 23 in them at ~260 positions, 8 sequences' 16 ms of 55.
//! On slices it measured 2–2.5 ms for one sequence and ~12.5 ms for eight with f32 K/V,
//! ~1.1 and ~8 ms with the f16 K/V held now ([`crate::kv::KV_DTYPE`]), converted eight
//! values at a time (F16C), and 0.77 and 5.5–6 ms with four positions' scores at a time and
//! the weighted sum of V kept in registers (at ~260 positions).
//!
//! A prefill chunk's attention stays on candle's matmuls (its many queries make them
//! compute-bound); only its scale, causal mask and softmax are one pass here
//! ([`causal_softmax`]).

use super::exp::exp_minus;
use half::f16;

/// `out` = softmax(q·Kᵀ/√hd)·V for one head's query `q` (`hd` values, rotary applied) over
/// the positions of that head's `k` and `v` (`positions × hd` each, as many in both; f16, as
/// the K/V are held).
pub fn attend_head(q: &[f32], k: &[f16], v: &[f16], out: &mut [f32]) {
    let hd = q.len();
    out.fill(0.0);
    if hd == 0 || k.len() != v.len() || !k.len().is_multiple_of(hd) {
        return;
    }
    let scale = 1.0 / (hd as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked)
        unsafe { avx2::attend_head(q, k, v, scale, out) };
        return;
    }
    let mut scores: Vec<f32> = k.chunks_exact(hd).map(|kj| dot(q, kj) * scale).collect();
    softmax(&mut scores);
    for (p, vj) in scores.iter().zip(v.chunks_exact(hd)) {
        add_scaled(out, *p, vj);
    }
}

/// [`attend_head`] for query heads that share one K/V head (grouped-query attention): `q`
/// and `out` hold the heads one after another, `hd` values each. Where the CPU has AVX-512
/// and `hd` is a multiple of 64, each position's V is converted from f16 once for all the
/// heads (and the scores take sixteen positions per reduction); each head's numbers are the
/// same however many heads are computed together, so the caller may group them as it likes.
pub fn attend_heads(q: &[f32], k: &[f16], v: &[f16], hd: usize, out: &mut [f32]) {
    out.fill(0.0);
    if hd == 0 || q.len() != out.len() || !q.len().is_multiple_of(hd) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(avx512::DIMS) && super::cpu::avx512f() {
        // SAFETY: the CPU has AVX-512F (checked); `hd` is a multiple of 64 (checked)
        unsafe { avx512::attend(q, k, v, hd, out) };
        return;
    }
    for (q, out) in q.chunks(hd).zip(out.chunks_mut(hd)) {
        attend_head(q, k, v, out);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Sixteen lanes where the CPU has AVX-512 (checked at run time).
    //! Scores: a position's products with one head's query summed in a register, sixteen
    //! positions' registers reduced together into one register of sixteen scores (45
    //! instructions instead of sixteen horizontal sums). Weighted sum of V: each position's 64
    //! dimensions converted once and added into up to four heads' registers.

    use super::f16;
    use std::arch::x86_64::*;

    /// Dimensions per pass of the weighted sum (four registers).
    pub const DIMS: usize = 64;

    /// Heads sharing one pass over V (their sums in sixteen registers).
    const HEADS: usize = 4;

    /// # Safety
    /// The CPU must have AVX-512F; `hd` a multiple of [`DIMS`], `q` and `out` whole heads.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn attend(q: &[f32], k: &[f16], v: &[f16], hd: usize, out: &mut [f32]) {
        let heads = q.len() / hd;
        let len = k.len().min(v.len()) / hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut p = vec![0f32; heads * len];
        for (h, (q, p)) in q
            .chunks_exact(hd)
            .zip(p.chunks_exact_mut(len.max(1)))
            .enumerate()
        {
            // the first head's pass fetches V into the cache as it goes, for the weighted
            // sums (measured: V's loads missing the cache were a third of this function)
            let fetch = if h == 0 { v } else { &[] };
            // SAFETY: as this function's contract; `p` is `len` scores
            unsafe {
                match hd {
                    64 => scores::<4>(q, k, fetch, scale, p),
                    128 => scores::<8>(q, k, fetch, scale, p),
                    _ => scores_any(q, k, scale, p),
                }
            }
            super::softmax(p);
        }
        if len == 0 {
            return;
        }
        for c0 in (0..hd).step_by(DIMS) {
            for h0 in (0..heads).step_by(HEADS) {
                // SAFETY: as this function's contract; heads `h0..` exist in `p` and `out`
                unsafe {
                    match heads - h0 {
                        1 => weighted_sum::<1>(&p, len, v, hd, c0, h0, out),
                        2 => weighted_sum::<2>(&p, len, v, hd, c0, h0, out),
                        3 => weighted_sum::<3>(&p, len, v, hd, c0, h0, out),
                        _ => weighted_sum::<HEADS>(&p, len, v, hd, c0, h0, out),
                    }
                }
            }
        }
    }

    /// `16 × N` f16 values at `at` as f32 registers.
    ///
    /// # Safety
    /// AVX-512F; `at` covers `16 × N` values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn row<const N: usize>(at: *const f16) -> [__m512; N] {
        let mut out = [_mm512_setzero_ps(); N];
        for (c, o) in out.iter_mut().enumerate() {
            // SAFETY: 16 values at `16c < 16N` (the caller's contract)
            *o = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(at.add(16 * c).cast()) });
        }
        out
    }

    /// The products of one position's `16 × N` values at `at` with a query, still in lanes.
    ///
    /// # Safety
    /// AVX-512F; `at` covers `16 × N` values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn products<const N: usize>(q: &[__m512; N], at: *const f16) -> __m512 {
        // SAFETY: the caller's contract
        let k = unsafe { row::<N>(at) };
        let mut t = _mm512_mul_ps(q[0], k[0]);
        for c in 1..N {
            t = _mm512_fmadd_ps(q[c], k[c], t);
        }
        t
    }

    /// `scale · q · k_j` for every position `j` of `k` into `out` (`q` 16 × N values),
    /// prefetching the same positions of `fetch` (when it holds them) sixteen at a time.
    ///
    /// # Safety
    /// AVX-512F; `k` at least `out.len()` positions of `16 × N`.
    #[target_feature(enable = "avx512f")]
    unsafe fn scores<const N: usize>(
        q: &[f32],
        k: &[f16],
        fetch: &[f16],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = 16 * N;
        let len = out.len();
        // SAFETY: loads read positions below `len` of `k` and `hd` values of `q`; stores
        // write 16 floats below `len`
        unsafe {
            let mut qv = [_mm512_setzero_ps(); N];
            for (c, v) in qv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(q.as_ptr().add(16 * c));
            }
            let at = |j: usize| k.as_ptr().add(j * hd);
            let s = _mm512_set1_ps(scale);
            let lines = fetch.len() * 2 / 64;
            for j0 in (0..len / 16 * 16).step_by(16) {
                // 16 positions of 32·N bytes: N/2 × 16 cache lines (a prefetch never faults;
                // only lines inside `fetch` are named)
                let first = j0 * hd * 2 / 64;
                for line in first..(first + N * 8).min(lines) {
                    _mm_prefetch::<_MM_HINT_T0>(fetch.as_ptr().cast::<i8>().add(64 * line));
                }
                let mut v = [_mm512_setzero_ps(); 16];
                for (i, v) in v.iter_mut().enumerate() {
                    *v = products(&qv, at(j0 + i));
                }
                _mm512_storeu_ps(out.as_mut_ptr().add(j0), _mm512_mul_ps(reduce16(v), s));
            }
            for (j, o) in out.iter_mut().enumerate().skip(len / 16 * 16) {
                *o = _mm512_reduce_add_ps(products(&qv, at(j))) * scale;
            }
        }
    }

    /// [`scores`] for head sizes without their own instance (multiples of 64 other than 64
    /// and 128): one position at a time.
    ///
    /// # Safety
    /// As [`scores`], with `q.len()` a multiple of 16.
    #[target_feature(enable = "avx512f")]
    unsafe fn scores_any(q: &[f32], k: &[f16], scale: f32, out: &mut [f32]) {
        let hd = q.len();
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: reads 16 values at `c < hd` of `q` and of position `j` of `k`
            unsafe {
                let mut t = _mm512_setzero_ps();
                for c in (0..hd).step_by(16) {
                    let kv = _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(j * hd + c).cast()));
                    t = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(c)), kv, t);
                }
                *o = _mm512_reduce_add_ps(t) * scale;
            }
        }
    }

    /// Sixteen registers' sums, register `i`'s in lane `i`: pairs of registers interleaved
    /// and added, then pairs of those, then the 128-bit quarters across registers.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn reduce16(v: [__m512; 16]) -> __m512 {
        // per 128-bit quarter: [a0+a2, b0+b2, a1+a3, b1+b3]
        let mut w = [_mm512_setzero_ps(); 8];
        for (i, w) in w.iter_mut().enumerate() {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            *w = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // per quarter: registers 4i..4i + 4, each summed over that quarter
        let mut x = [_mm512_setzero_ps(); 4];
        for (i, x) in x.iter_mut().enumerate() {
            let (a, b) = (w[2 * i], w[2 * i + 1]);
            *x = _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
            );
        }
        // quarters: [a q0+q1, a q2+q3, b q0+q1, b q2+q3], then across again
        let lo = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x[0], x[1]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x[0], x[1]),
        );
        let hi = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x[2], x[3]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x[2], x[3]),
        );
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(lo, hi),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(lo, hi),
        )
    }

    /// `out[h][c0..c0 + 64] = Σ_j p[h][j] · v_j[c0..c0 + 64]` for heads `h0..h0 + H`.
    ///
    /// # Safety
    /// AVX-512F; `v` at least `len` positions of `hd`, `c0 + 64 ≤ hd`; `p` and `out` hold
    /// heads `h0..h0 + H` (`len` and `hd` values each).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn weighted_sum<const H: usize>(
        p: &[f32],
        len: usize,
        v: &[f16],
        hd: usize,
        c0: usize,
        h0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: loads read 64 values at `j * hd + c0` of `v` for `j < len` and score `j`
        // of each head; stores write 64 floats at `h * hd + c0` of `out`
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 4]; H];
            for j in 0..len {
                let x = row::<4>(v.as_ptr().add(j * hd + c0));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.get_unchecked((h0 + h) * len + j));
                    for c in 0..4 {
                        acc[c] = _mm512_fmadd_ps(w, x[c], acc[c]);
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                for (c, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add((h0 + h) * hd + c0 + 16 * c), *a);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The two passes over the positions with their hot values in registers: four positions'
    //! scores at a time (one horizontal sum for four), and the weighted sum of V kept in
    //! eight registers per 64 dimensions instead of loaded and stored per position. Every
    //! function needs AVX2, FMA and F16C (the caller checks `cpu::avx2`).

    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::attend_head`] with these kernels.
    ///
    /// # Safety
    /// The CPU must have the features enabled here (`cpu::avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn attend_head(q: &[f32], k: &[f16], v: &[f16], scale: f32, out: &mut [f32]) {
        let mut scores = scores(q, k, scale);
        super::softmax(&mut scores);
        if weighted_sum(&scores, v, out) {
            return;
        }
        for (p, vj) in scores.iter().zip(v.chunks_exact(q.len())) {
            add_scaled(out, *p, vj);
        }
    }

    /// `q · k_j × scale` for every position `j` of `k` (`positions × q.len()`).
    ///
    /// # Safety
    /// The CPU must have the features enabled here (`cpu::avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn scores(q: &[f32], k: &[f16], scale: f32) -> Vec<f32> {
        let hd = q.len();
        let len = k.len() / hd.max(1);
        let mut out = vec![0f32; len];
        let fours = if hd.is_multiple_of(8) { len / 4 } else { 0 };
        // SAFETY: loads read 8 values at `i < hd` of `q` and of positions `j..j + 4 ≤ len` of
        // `k` (`len × hd` values), and the store writes 4 floats at `j + 4 ≤ len` of `out`
        unsafe {
            for f in 0..fours {
                let j = 4 * f;
                let mut acc = [_mm256_setzero_ps(); 4];
                for i in (0..hd).step_by(8) {
                    let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                    for (r, a) in acc.iter_mut().enumerate() {
                        let kv = k.as_ptr().add((j + r) * hd + i);
                        *a = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(kv.cast())), *a);
                    }
                }
                // lanes summed pairwise: [a0 a1 a2 a3] per 128-bit half, then the halves
                let t = _mm256_hadd_ps(
                    _mm256_hadd_ps(acc[0], acc[1]),
                    _mm256_hadd_ps(acc[2], acc[3]),
                );
                let sums = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
                _mm_storeu_ps(
                    out.as_mut_ptr().add(j),
                    _mm_mul_ps(sums, _mm_set1_ps(scale)),
                );
            }
        }
        for (j, o) in out.iter_mut().enumerate().skip(4 * fours) {
            *o = dot(q, &k[j * hd..(j + 1) * hd]) * scale;
        }
        out
    }

    /// `out = Σ_j p_j · v_j` when `out`'s length is a multiple of 64 (false, nothing written,
    /// otherwise).
    ///
    /// # Safety
    /// The CPU must have the features enabled here (`cpu::avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn weighted_sum(p: &[f32], v: &[f16], out: &mut [f32]) -> bool {
        let hd = out.len();
        if hd == 0 || !hd.is_multiple_of(64) || v.len() < p.len() * hd {
            return false;
        }
        for chunk in (0..hd).step_by(64) {
            // SAFETY: loads read 8 values at `j * hd + chunk + 8i` for `j < p.len()` and
            // `i < 8`, inside `v` (checked above: `p.len() × hd` values), and stores write 8
            // floats at `chunk + 8i < hd` of `out`
            unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                for (j, &pj) in p.iter().enumerate() {
                    let w = _mm256_set1_ps(pj);
                    let row = v.as_ptr().add(j * hd + chunk);
                    for (i, a) in acc.iter_mut().enumerate() {
                        let x = _mm256_cvtph_ps(_mm_loadu_si128(row.add(8 * i).cast()));
                        *a = _mm256_fmadd_ps(w, x, *a);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(chunk + 8 * i), *a);
                }
            }
        }
        true
    }

    /// `out += w · v`, eight values at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn add_scaled(out: &mut [f32], w: f32, v: &[f16]) {
        let n = out.len().min(v.len()) / 8 * 8;
        let w8 = _mm256_set1_ps(w);
        for i in (0..n).step_by(8) {
            // SAFETY: each access covers 8 values at `i < n`, `n` at most either slice's
            // length rounded down to a multiple of 8
            unsafe {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(w8, x, _mm256_loadu_ps(o)));
            }
        }
        for (o, x) in out[n..].iter_mut().zip(&v[n..]) {
            *o += w * x.to_f32();
        }
    }

    /// A dot product in eight lanes of fused multiply-adds (the compiler does not vectorize a
    /// float sum by itself: it may not reorder the additions).
    ///
    /// # Safety
    /// The CPU must have the features enabled here (`cpu::avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len().min(b.len()) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            // SAFETY: each load reads 8 values at `i < n`, `n` at most either slice's length
            // rounded down to a multiple of 8
            unsafe {
                let x = _mm256_loadu_ps(a.as_ptr().add(i));
                let y = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
                acc = _mm256_fmadd_ps(x, y, acc);
            }
        }
        let head = super::super::simd::hsum(acc);
        let tail: f32 = a[n..]
            .iter()
            .zip(&b[n..])
            .map(|(x, y)| x * y.to_f32())
            .sum();
        head + tail
    }
}

/// A prefill chunk's attention weights: `scores` holds rows of `start + n` scores (keys),
/// the rows of each head taking the chunk's `n` queries in order (query `i` at position
/// `start + i`); `out` gets each row scaled by `scale` and softmaxed over the keys the query
/// may see (`j ≤ start + i`), zero beyond. Rows are spread over the cores.
pub fn causal_softmax(scores: &[f32], out: &mut [f32], n: usize, start: usize, scale: f32) {
    use rayon::prelude::*;
    let keys = start + n;
    if n == 0 || keys == 0 || scores.len() != out.len() || !scores.len().is_multiple_of(keys) {
        return;
    }
    out.par_chunks_mut(keys)
        .zip(scores.par_chunks(keys))
        .enumerate()
        .for_each(|(r, (out, row))| {
            let seen = start + r % n + 1;
            let (visible, hidden) = out.split_at_mut(seen);
            for (o, s) in visible.iter_mut().zip(row) {
                *o = s * scale;
            }
            softmax(visible);
            hidden.fill(0.0);
        });
}

/// Softmax in place.
fn softmax(xs: &mut [f32]) {
    let max = xs.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
    exp_minus(xs, max);
    let sum: f32 = xs.iter().sum();
    if sum > 0.0 {
        let inv = 1.0 / sum;
        for x in xs.iter_mut() {
            *x *= inv;
        }
    }
}

/// `out += w · v`.
fn add_scaled(out: &mut [f32], w: f32, v: &[f16]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}

/// A dot product (the portable path; with AVX2, [`avx2::dot`]).
fn dot(a: &[f32], b: &[f16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// softmax(q·Kᵀ/√hd)·V for one head, naively in f64.
    fn definition(q: &[f32], k: &[f16], v: &[f16]) -> Vec<f64> {
        let (hd, len) = (q.len(), k.len() / q.len());
        let logits: Vec<f64> = (0..len)
            .map(|j| {
                (0..hd)
                    .map(|d| q[d] as f64 * k[j * hd + d].to_f64())
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let z: f64 = logits.iter().map(|l| l.exp()).sum();
        (0..hd)
            .map(|d| {
                (0..len)
                    .map(|j| logits[j].exp() / z * v[j * hd + d].to_f64())
                    .sum()
            })
            .collect()
    }

    fn val(i: usize) -> f32 {
        ((i * 7919) % 97) as f32 / 50.0 - 1.0
    }

    /// Against the definition computed naively in f64: a small head (the per-position
    /// paths), the head sizes real models use (64, 128: the register paths) and one that is
    /// not a multiple of 64, with position counts that are not multiples of four.
    #[test]
    fn matches_the_definition() {
        for (hd, len) in [(12, 7), (64, 7), (128, 9), (72, 5), (64, 1)] {
            let q: Vec<f32> = (0..hd).map(val).collect();
            let k: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 5))).collect();
            let v: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 11))).collect();
            let mut got = vec![0f32; hd];
            attend_head(&q, &k, &v, &mut got);
            for (d, want) in definition(&q, &k, &v).into_iter().enumerate() {
                let g = got[d] as f64;
                assert!((g - want).abs() < 1e-5, "hd {hd} dim {d}: {g} vs {want}");
            }
        }
    }

    /// Heads sharing one K/V: each matches the definition, and equals that head computed
    /// alone bit for bit (grouping must not change a head's numbers). Head sizes of the
    /// 16-lane paths (64, 128, 192) and one outside them (72); position counts around the
    /// sixteen a reduction takes; one to six heads (passes of up to four).
    #[test]
    fn grouped_heads_match_the_definition_and_each_head_alone() {
        for (hd, len) in [(64, 1), (64, 16), (64, 37), (128, 33), (192, 18), (72, 20)] {
            for heads in 1..=6 {
                let q: Vec<f32> = (0..heads * hd).map(|i| val(i + 3 * heads)).collect();
                let k: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 5))).collect();
                let v: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 11))).collect();
                let mut got = vec![f32::NAN; heads * hd];
                attend_heads(&q, &k, &v, hd, &mut got);
                for (h, (q, got)) in q.chunks(hd).zip(got.chunks(hd)).enumerate() {
                    let mut alone = vec![f32::NAN; hd];
                    attend_heads(q, &k, &v, hd, &mut alone);
                    assert_eq!(
                        got,
                        &alone[..],
                        "head {h} of {heads} (hd {hd}, {len} positions)"
                    );
                    for (d, want) in definition(q, &k, &v).into_iter().enumerate() {
                        let g = got[d] as f64;
                        assert!(
                            (g - want).abs() < 1e-5,
                            "hd {hd} head {h} dim {d}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The fused prefill softmax against its definition: scale, mask keys after the query's
    /// position, softmax.
    #[test]
    fn causal_softmax_masks_the_future() {
        let (heads, n, start) = (3, 5, 4);
        let keys = start + n;
        let scores: Vec<f32> = (0..heads * n * keys)
            .map(|i| ((i * 29 % 23) as f32 - 11.0) * 0.4)
            .collect();
        let mut got = vec![f32::NAN; scores.len()];
        causal_softmax(&scores, &mut got, n, start, 0.5);
        for (r, (row, got)) in scores.chunks(keys).zip(got.chunks(keys)).enumerate() {
            let seen = start + r % n + 1;
            let z: f64 = row[..seen].iter().map(|s| (*s as f64 * 0.5).exp()).sum();
            for (j, g) in got.iter().enumerate() {
                let want = if j < seen {
                    (row[j] as f64 * 0.5).exp() / z
                } else {
                    0.0
                };
                assert!(
                    (*g as f64 - want).abs() < 1e-6,
                    "row {r} key {j}: {g} vs {want}"
                );
            }
        }
    }
}
