//! Attention of one new position over a sequence's K/V, on plain slices: what a decode step
//! computes per sequence, layer and head.
//!
//! Through candle's tensor operations this was a dozen small operations (narrow, copy, two
//! matmuls that pack their operands, scale, softmax, reshape) per sequence and layer: one
//! sequence's step spent 5.9 ms of 23 in them at ~260 positions, 8 sequences' 16 ms of 55.
//! On slices it measured 2–2.5 ms for one sequence and ~12.5 ms for eight with f32 K/V,
//! ~1.1 and ~8 ms with the f16 K/V held now ([`super::llama::KV_DTYPE`]), converted eight
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
    #[cfg(target_feature = "avx2")]
    let mut scores = avx2::scores(q, k, scale);
    #[cfg(not(target_feature = "avx2"))]
    let mut scores: Vec<f32> = k.chunks_exact(hd).map(|kj| dot(q, kj) * scale).collect();
    softmax(&mut scores);
    #[cfg(target_feature = "avx2")]
    if avx2::weighted_sum(&scores, v, out) {
        return;
    }
    for (p, vj) in scores.iter().zip(v.chunks_exact(hd)) {
        add_scaled(out, *p, vj);
    }
}

#[cfg(target_feature = "avx2")]
mod avx2 {
    //! The two passes over the positions with their hot values in registers: four positions'
    //! scores at a time (one horizontal sum for four), and the weighted sum of V kept in
    //! eight registers per 64 dimensions instead of loaded and stored per position.

    use half::f16;
    use std::arch::x86_64::*;

    /// `q · k_j × scale` for every position `j` of `k` (`positions × q.len()`).
    pub fn scores(q: &[f32], k: &[f16], scale: f32) -> Vec<f32> {
        let hd = q.len();
        let len = k.len() / hd.max(1);
        let mut out = vec![0f32; len];
        let fours = if hd.is_multiple_of(8) { len / 4 } else { 0 };
        // SAFETY: loads read 8 values at `i < hd` of `q` and of positions `j..j + 4 ≤ len` of
        // `k` (`len × hd` values), and the store writes 4 floats at `j + 4 ≤ len` of `out`;
        // AVX2, FMA and F16C are enabled for the whole build.
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
            *o = super::dot(q, &k[j * hd..(j + 1) * hd]) * scale;
        }
        out
    }

    /// `out = Σ_j p_j · v_j` when `out`'s length is a multiple of 64 (false, nothing written,
    /// otherwise).
    pub fn weighted_sum(p: &[f32], v: &[f16], out: &mut [f32]) -> bool {
        let hd = out.len();
        if hd == 0 || !hd.is_multiple_of(64) || v.len() < p.len() * hd {
            return false;
        }
        for chunk in (0..hd).step_by(64) {
            // SAFETY: loads read 8 values at `j * hd + chunk + 8i` for `j < p.len()` and
            // `i < 8`, inside `v` (checked above: `p.len() × hd` values), and stores write 8
            // floats at `chunk + 8i < hd` of `out`; AVX2, FMA and F16C are enabled.
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
    #[cfg(target_feature = "avx2")]
    {
        use std::arch::x86_64::*;
        let n = out.len().min(v.len()) / 8 * 8;
        // SAFETY: each access covers 8 values at `i < n`, `n` at most either slice's length
        // rounded down to a multiple of 8; AVX2, FMA and F16C are enabled for the whole build.
        unsafe {
            let w8 = _mm256_set1_ps(w);
            for i in (0..n).step_by(8) {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(w8, x, _mm256_loadu_ps(o)));
            }
        }
        for (o, x) in out[n..].iter_mut().zip(&v[n..]) {
            *o += w * x.to_f32();
        }
    }
    #[cfg(not(target_feature = "avx2"))]
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}

/// A dot product; with AVX2, eight lanes of fused multiply-adds (the compiler does not
/// vectorize a float sum by itself: it may not reorder the additions).
fn dot(a: &[f32], b: &[f16]) -> f32 {
    #[cfg(target_feature = "avx2")]
    {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len()) / 8 * 8;
        // SAFETY: each load reads 8 floats at `i < n`, `n` at most either slice's length
        // rounded down to a multiple of 8; AVX2 and FMA are enabled for the whole build.
        let acc = unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in (0..n).step_by(8) {
                let x = _mm256_loadu_ps(a.as_ptr().add(i));
                let y = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
                acc = _mm256_fmadd_ps(x, y, acc);
            }
            acc
        };
        let head = super::simd::hsum(acc);
        let tail: f32 = a[n..]
            .iter()
            .zip(&b[n..])
            .map(|(x, y)| x * y.to_f32())
            .sum();
        head + tail
    }
    #[cfg(not(target_feature = "avx2"))]
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the definition computed naively in f64: a small head (the per-position
    /// paths), the head sizes real models use (64, 128: the register paths) and one that is
    /// not a multiple of 64, with position counts that are not multiples of four.
    #[test]
    fn matches_the_definition() {
        for (hd, len) in [(12, 7), (64, 7), (128, 9), (72, 5), (64, 1)] {
            let val = |i: usize| ((i * 7919) % 97) as f32 / 50.0 - 1.0;
            let q: Vec<f32> = (0..hd).map(val).collect();
            let k: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 5))).collect();
            let v: Vec<f16> = (0..len * hd).map(|i| f16::from_f32(val(i + 11))).collect();
            let mut got = vec![0f32; hd];
            attend_head(&q, &k, &v, &mut got);
            let logits: Vec<f64> = (0..len)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[d] as f64 * k[j * hd + d].to_f64())
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let z: f64 = logits.iter().map(|l| l.exp()).sum();
            for d in 0..hd {
                let want: f64 = (0..len)
                    .map(|j| logits[j].exp() / z * v[j * hd + d].to_f64())
                    .sum();
                let g = got[d] as f64;
                assert!((g - want).abs() < 1e-5, "hd {hd} dim {d}: {g} vs {want}");
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
