//! Exponentials eight at a time, for the two places a forward pass takes many of them:
//! attention's softmax and the feed-forward's SiLU. The C library's `expf`, one value at a
//! time, was a sixth of eight sequences' decode attention and ~6 % of a prefill (its SiLU
//! over `positions × 1536` values per layer, through candle).

/// `x = e^(x − c)` for every value: with AVX2 eight at a time by the usual range reduction
/// (`2^n · e^r`, |r| ≤ ln2/2, a degree-7 polynomial for `e^r`; relative error ~1e-7).
pub fn exp_minus(xs: &mut [f32], c: f32) {
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above)
        unsafe { exp_minus_avx2(xs, c) };
        return;
    }
    for x in xs.iter_mut() {
        *x = (*x - c).exp();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_minus_avx2(xs: &mut [f32], c: f32) {
    use std::arch::x86_64::*;
    let n = xs.len() / 8 * 8;
    let c8 = _mm256_set1_ps(c);
    for i in (0..n).step_by(8) {
        // SAFETY: each access covers 8 values at `i < n`, `n` the slice's length rounded
        // down to a multiple of 8
        unsafe {
            let p = xs.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), c8)));
        }
    }
    for x in xs[n..].iter_mut() {
        *x = (*x - c).exp();
    }
}

/// `e^x` for eight values (the Cephes single-precision method).
///
/// # Safety
/// The CPU must have the features enabled here (`cpu::avx2`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    {
        let set = _mm256_set1_ps;
        let x = _mm256_max_ps(_mm256_min_ps(x, set(88.376_26)), set(-88.376_26));
        // x = n·ln2 + r, ln2 split in two so that n·ln2 is exact in its high part
        let n = _mm256_floor_ps(_mm256_fmadd_ps(x, set(std::f32::consts::LOG2_E), set(0.5)));
        let r = _mm256_fnmadd_ps(n, set(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, set(-2.121_944_4e-4), r);
        let mut y = set(1.987_569_1e-4);
        for coefficient in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            y = _mm256_fmadd_ps(y, r, set(coefficient));
        }
        let y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, set(1.0)));
        // 2^n from the exponent bits (n ≥ -127: the clamp above)
        let two_n = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(y, _mm256_castsi256_ps(two_n))
    }
}

/// `out[i] = silu(g[i]) · u[i]` (`silu(g) = g / (1 + e^−g)`): the SwiGLU of a feed-forward
/// layer's gate and up projections. Spread over the cores when there are many values (a
/// prefill chunk's).
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;
    const PER_TASK: usize = 1 << 14;
    let n = out.len().min(g.len()).min(u.len());
    let (g, u, out) = (&g[..n], &u[..n], &mut out[..n]);
    if n >= 4 * PER_TASK {
        out.par_chunks_mut(PER_TASK)
            .zip(g.par_chunks(PER_TASK).zip(u.par_chunks(PER_TASK)))
            .for_each(|(o, (g, u))| silu_mul_run(g, u, o));
    } else {
        silu_mul_run(g, u, out);
    }
}

/// [`silu_mul`] on one thread; the three slices are equally long.
fn silu_mul_run(g: &[f32], u: &[f32], out: &mut [f32]) {
    out.copy_from_slice(g);
    for x in out.iter_mut() {
        *x = -*x;
    }
    exp_minus(out, 0.0);
    for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + *o) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorized exponential against the C library's, over the range softmax feeds it
    /// (x − max ≤ 0) and a little beyond.
    #[test]
    fn exp_matches_the_library() {
        let xs: Vec<f32> = (0..2000).map(|i| -90.0 + i as f32 * 0.05).collect();
        let mut got = xs.clone();
        exp_minus(&mut got, 0.0);
        for (x, g) in xs.iter().zip(&got) {
            let want = x.exp();
            assert!(
                (g - want).abs() <= 2e-6 * want + 1e-37,
                "exp({x}) = {g}, want {want}"
            );
        }
    }

    /// SwiGLU through the vectorized exponential against its definition with the library's.
    #[test]
    fn silu_mul_matches_its_definition() {
        for n in [7, 64, 1000, 70_000] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 200) as f32 - 100.0) * 0.13)
                .collect();
            let u: Vec<f32> = (0..n)
                .map(|i| ((i * 11 % 90) as f32 - 45.0) * 0.07)
                .collect();
            let mut got = vec![0f32; n];
            silu_mul(&g, &u, &mut got);
            for ((g, u), o) in g.iter().zip(&u).zip(&got) {
                let want = g / (1.0 + (-g).exp()) * u;
                assert!(
                    (o - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{o} vs {want}"
                );
            }
        }
    }
}
