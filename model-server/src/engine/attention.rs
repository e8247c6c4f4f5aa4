//! Attention of one new position over a sequence's K/V, on plain slices: what a decode step
//! computes per sequence, layer and head.
//!
//! Through candle's tensor operations this was a dozen small operations (narrow, copy, two
//! matmuls that pack their operands, scale, softmax, reshape) per sequence and layer: one
//! sequence's step spent 5.9 ms of 23 in them at ~260 positions, 8 sequences' 16 ms of 55.
//! Here it is 2–2.5 ms for one sequence and ~12.5 ms for eight, which is close to reading
//! their K/V once (f32, ~0.46 MB per sequence and layer at 300 positions: as many bytes per
//! step for 8 sequences as the 8-bit weights).

/// `out` = softmax(q·Kᵀ/√hd)·V for one head's query `q` (`hd` values, rotary applied) over
/// the positions of that head's `k` and `v` (`positions × hd` each, as many in both).
pub fn attend_head(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    let hd = q.len();
    out.fill(0.0);
    if hd == 0 || k.len() != v.len() || !k.len().is_multiple_of(hd) {
        return;
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scores: Vec<f32> = k.chunks_exact(hd).map(|kj| dot(q, kj) * scale).collect();
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
    let mut sum = 0f32;
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        sum += *sc;
    }
    for (p, vj) in scores.iter().zip(v.chunks_exact(hd)) {
        let w = p / sum;
        for (o, x) in out.iter_mut().zip(vj) {
            *o += w * x;
        }
    }
}

/// A dot product; with AVX2, eight lanes of fused multiply-adds (the compiler does not
/// vectorize a float sum by itself: it may not reorder the additions).
fn dot(a: &[f32], b: &[f32]) -> f32 {
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
                let y = _mm256_loadu_ps(b.as_ptr().add(i));
                acc = _mm256_fmadd_ps(x, y, acc);
            }
            acc
        };
        let head = super::simd::hsum(acc);
        let tail: f32 = a[n..].iter().zip(&b[n..]).map(|(x, y)| x * y).sum();
        head + tail
    }
    #[cfg(not(target_feature = "avx2"))]
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the definition computed naively.
    #[test]
    fn matches_the_definition() {
        let (hd, len) = (12, 7);
        let val = |i: usize| ((i * 7919) % 97) as f32 / 50.0 - 1.0;
        let q: Vec<f32> = (0..hd).map(val).collect();
        let k: Vec<f32> = (0..len * hd).map(|i| val(i + 5)).collect();
        let v: Vec<f32> = (0..len * hd).map(|i| val(i + 11)).collect();
        let mut got = vec![0f32; hd];
        attend_head(&q, &k, &v, &mut got);
        let logits: Vec<f32> = (0..len)
            .map(|j| (0..hd).map(|d| q[d] * k[j * hd + d]).sum::<f32>() / (hd as f32).sqrt())
            .collect();
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for d in 0..hd {
            let want: f32 = (0..len).map(|j| logits[j].exp() / z * v[j * hd + d]).sum();
            assert!(
                (got[d] - want).abs() < 1e-5,
                "dim {d}: {} vs {want}",
                got[d]
            );
        }
    }
}
