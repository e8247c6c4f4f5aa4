//! Decode-step weight matrices in 4 bits, for matrices the GGUF itself holds in 4 bits (its
//! Q4_1 blocks: 32 values `m + d·q`, `q` in 0..15): the same values as the file, read at half
//! the bytes of the 8-bit copy ([`super::q8`]).
//!
//! A decode step's matrices take most of its time, and that time is reading them: measured on
//! SmolLM2-135M's matrices, 13–17 ms per step in 8 bits at ~10 GB/s. The weights here are
//! re-encoded from the f32 values the prefill uses, and kept in 4 bits only when that
//! re-encoding is exact (a Q4_1 block's smallest value is `m` and its largest `m + 15d`, so
//! the encoding finds the file's grid again); any other matrix stays in 8 bits. Scales are
//! kept in f32 (no conversion per block).
//!
//! A block's dot product with 8-bit activations `dx·x` is `d·dx·Σ q·x + m·dx·Σ x`: an exact
//! integer sum of unsigned-by-signed products, plus the activation block's sum (kept with the
//! activations, [`ActRow::s`]) times the offset.

use super::q8::{whole_rows, ActRow, BlockMatrix, BLOCK, ROWS_AT_ONCE};
use rayon::prelude::*;

/// Bytes of one block's 32 4-bit values: byte `j` holds value `j` (low nibble) and `j + 16`.
const PACKED: usize = BLOCK / 2;

/// A weight matrix `[out, in]` in 4-bit blocks.
pub struct Q4Matrix {
    out: usize,
    width: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

/// How far a re-encoded value may be from the original, relative to its block's largest
/// magnitude, for the encoding to count as exact (f32 rounding is ~1e-7; a value off the
/// 4-bit grid is off by up to 1/30 of its block's range).
const EXACT: f32 = 1e-5;

impl Q4Matrix {
    /// Encodes `values` (`out` rows of `width`, a multiple of 32) when each block's values lie
    /// on a 16-level grid from its smallest to its largest value; `None` when any does not.
    pub fn exact(values: &[f32], width: usize) -> Option<Q4Matrix> {
        if !whole_rows(values.len(), width) {
            return None;
        }
        let blocks = values.len() / BLOCK;
        let mut qs = vec![0u8; blocks * PACKED];
        let mut d = vec![0f32; blocks];
        let mut m = vec![0f32; blocks];
        let exact = values
            .par_chunks(BLOCK)
            .zip(qs.par_chunks_mut(PACKED))
            .zip(d.par_iter_mut().zip(m.par_iter_mut()))
            .all(|((v, packed), (d, m))| encode_block(v, packed, d, m));
        exact.then_some(Q4Matrix {
            out: values.len() / width,
            width,
            qs,
            d,
            m,
        })
    }

    /// Row `r`'s packed values, scales and offsets.
    fn row(&self, r: usize) -> (&[u8], &[f32], &[f32]) {
        let per_row = self.width / BLOCK;
        let blocks = r * per_row..(r + 1) * per_row;
        (
            &self.qs[blocks.start * PACKED..blocks.end * PACKED],
            &self.d[blocks.clone()],
            &self.m[blocks],
        )
    }
}

/// Encodes one block; false when its values are not on the grid.
fn encode_block(v: &[f32], packed: &mut [u8], d: &mut f32, m: &mut f32) -> bool {
    let (lo, hi) = v
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() || !hi.is_finite() {
        return false;
    }
    *m = lo;
    *d = (hi - lo) / 15.0;
    let inv = if *d > 0.0 { 1.0 / *d } else { 0.0 };
    let tolerance = EXACT * lo.abs().max(hi.abs());
    let mut q = [0u8; BLOCK];
    for (q, &x) in q.iter_mut().zip(v) {
        *q = ((x - lo) * inv).round().clamp(0.0, 15.0) as u8;
        if (lo + *d * *q as f32 - x).abs() > tolerance {
            return false;
        }
    }
    for (j, byte) in packed.iter_mut().enumerate() {
        *byte = q[j] | (q[j + PACKED] << 4);
    }
    true
}

impl BlockMatrix for Q4Matrix {
    fn out(&self) -> usize {
        self.out
    }

    fn width(&self) -> usize {
        self.width
    }

    fn dot_rows(&self, col: usize, xs: &[ActRow<'_>], dst: &mut [f32]) {
        let w = self.row(col);
        #[cfg(target_feature = "avx2")]
        {
            fn fill<const R: usize>(
                w: (&[u8], &[f32], &[f32]),
                xs: &[ActRow<'_>],
                dst: &mut [f32],
            ) {
                let Some(first) = xs.first() else {
                    return;
                };
                let mut group = [*first; R];
                for (slot, x) in group.iter_mut().zip(xs) {
                    *slot = *x;
                }
                for (d, v) in dst.iter_mut().zip(avx2::dot(w, group)) {
                    *d = v;
                }
            }
            match xs.len() {
                0 => {}
                1 => fill::<1>(w, xs, dst),
                2 => fill::<2>(w, xs, dst),
                3 => fill::<3>(w, xs, dst),
                _ => fill::<ROWS_AT_ONCE>(w, xs, dst),
            }
        }
        #[cfg(not(target_feature = "avx2"))]
        for (d, x) in dst.iter_mut().zip(xs) {
            *d = dot_scalar(w, *x);
        }
    }
}

/// One row's dot product, block by block (the definition the SIMD kernel is tested against,
/// and the kernel of builds without AVX2).
#[cfg_attr(target_feature = "avx2", allow(dead_code))]
fn dot_scalar((qs, wd, wm): (&[u8], &[f32], &[f32]), x: ActRow<'_>) -> f32 {
    qs.chunks(PACKED)
        .zip(x.q.chunks(BLOCK))
        .zip(wd.iter().zip(wm))
        .zip(x.d.iter().zip(x.s))
        .map(|(((packed, xq), (dw, mw)), (dx, sx))| {
            let dot: i32 = (0..BLOCK)
                .map(|i| {
                    let byte = packed[i % PACKED];
                    let q = if i < PACKED { byte & 15 } else { byte >> 4 };
                    q as i32 * xq[i] as i32
                })
                .sum();
            dot as f32 * dw * dx + mw * sx
        })
        .sum()
}

#[cfg(target_feature = "avx2")]
mod avx2 {
    //! Per block: the 16 packed bytes spread to 32 unsigned values (low nibbles, then high),
    //! multiplied with the signed activations and summed in pairs to 16 bits (at most
    //! 2·15·127, no saturation) and to 32 bits, scaled in f32; the offset term per block in
    //! scalar f32.

    use super::{ActRow, BLOCK, PACKED};
    use std::arch::x86_64::*;

    pub fn dot<const R: usize>(
        (qs, wd, wm): (&[u8], &[f32], &[f32]),
        xs: [ActRow<'_>; R],
    ) -> [f32; R] {
        let blocks = wd.len();
        let mut out = [0f32; R];
        if qs.len() < blocks * PACKED
            || wm.len() < blocks
            || xs
                .iter()
                .any(|x| x.q.len() < blocks * BLOCK || x.d.len() < blocks || x.s.len() < blocks)
        {
            return out;
        }
        // SAFETY: loads read 16 bytes at `b * 16` of `qs` and 32 at `b * 32` of each row, for
        // `b < blocks`, inside slices checked above; AVX2 is enabled for the whole build.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let low = _mm_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut offset = [0f32; R];
            for b in 0..blocks {
                let raw = _mm_loadu_si128(qs.as_ptr().add(b * PACKED).cast());
                let q = _mm256_set_m128i(
                    _mm_and_si128(_mm_srli_epi16(raw, 4), low),
                    _mm_and_si128(raw, low),
                );
                let dw = *wd.get_unchecked(b);
                let mw = *wm.get_unchecked(b);
                for r in 0..R {
                    let x = xs[r];
                    let xq = _mm256_loadu_si256(x.q.as_ptr().add(b * BLOCK).cast());
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), ones);
                    let s = _mm256_set1_ps(dw * *x.d.get_unchecked(b));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r]);
                    offset[r] += mw * *x.s.get_unchecked(b);
                }
            }
            for ((o, v), off) in out.iter_mut().zip(acc).zip(offset) {
                *o = super::super::simd::hsum(v) + off;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::q8::tests::{check, values};
    use super::super::q8::Act;
    use super::*;

    /// Values on a 4-bit grid per block, as a Q4_1 file's dequantized weights are.
    fn on_grid(n: usize) -> Vec<f32> {
        let raw = values(n, 3);
        raw.chunks(BLOCK)
            .enumerate()
            .flat_map(|(b, block)| {
                let (m, d) = (-0.3 + b as f32 * 0.01, 0.04 + (b % 5) as f32 * 0.003);
                block.iter().enumerate().map(move |(i, x)| {
                    // every block uses both ends of its grid, as a quantizer's output does
                    let q = match i {
                        0 => 0.0,
                        1 => 15.0,
                        _ => ((x + 1.0) * 7.5).floor().clamp(0.0, 15.0),
                    };
                    m + d * q
                })
            })
            .collect()
    }

    #[test]
    fn matches_f32_and_rows_are_independent() {
        let (out, width) = (70, 96);
        let w = on_grid(out * width);
        let m = Q4Matrix::exact(&w, width).expect("values on the grid encode exactly");
        // only the activations' 8-bit rounding is left
        check(&m, &w, 0.01);
    }

    #[test]
    fn values_off_the_grid_are_refused() {
        let width = 96;
        assert!(Q4Matrix::exact(&values(10 * width, 4), width).is_none());
        let mut w = on_grid(10 * width);
        w[40] += 0.01;
        assert!(Q4Matrix::exact(&w, width).is_none());
        assert!(Q4Matrix::exact(&w[..100], 50).is_none());
    }

    /// The SIMD kernel computes what the block-by-block definition does.
    #[test]
    fn the_kernel_agrees_with_the_definition() {
        let width = 160;
        let w = Q4Matrix::exact(&on_grid(3 * width), width).unwrap();
        let x = Act::encode(&values(3 * width, 2), width).unwrap();
        let xs: Vec<_> = (0..3).map(|r| x.row(r)).collect();
        for c in 0..3 {
            let mut got = [0f32; 3];
            w.dot_rows(c, &xs, &mut got);
            for (r, g) in got.iter().enumerate() {
                let want = dot_scalar(w.row(c), xs[r]);
                assert!(
                    (g - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{g} vs {want}"
                );
            }
        }
    }
}
