//! Decode-step weight matrices in 4 bits, for matrices the GGUF itself holds in 4 bits (its
//! Q4_1 blocks: 32 values `m + d·q`, `q` in 0..15): the same values as the file, read at two
//! thirds of the bytes of an 8-bit copy ([`super::q8`]; 24 bytes per block with f32 scale and
//! offset, against 36).
//!
//! A decode step's matrices take most of its time, and that time is reading them: measured on
//! SmolLM2-135M's matrices, 13–17 ms per step in 8 bits at ~10 GB/s. The weights here are
//! re-encoded from the f32 values the prefill uses, and kept in 4 bits only when that
//! re-encoding is exact (a Q4_1 block's smallest value is `m` and its largest `m + 15d`, so
//! the encoding finds the file's grid again); any other matrix stays in 8 bits (a Q4_K or
//! Q4_0 file's blocks need not span their grid: they decode correctly, at the 8-bit speed).
//! Scales are kept in f32 (no conversion per block).
//!
//! A block's dot product with 8-bit activations `dx·x` is `d·dx·Σ q·x + m·dx·Σ x`: an exact
//! integer sum of unsigned-by-signed products, plus the activation block's sum (kept with the
//! activations, [`ActRow::s`]) times the offset.

use super::blocks::{whole_rows, ActRow, BlockMatrix, RowKernel, BLOCK};
use rayon::prelude::*;

/// Values per pair of blocks, the unit the kernels read: 32 bytes, byte `j` holding value `j`
/// of the first block (low nibble) and value `j` of the second (high nibble), so that one
/// 32-byte load and two masks give both blocks' values in the order the activations are.
const PAIR: usize = 2 * BLOCK;

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
    /// Encodes `values` (`out` rows of `width`, a multiple of 64) when each block's values lie
    /// on a 16-level grid from its smallest to its largest value; `None` when any does not.
    pub fn exact(values: &[f32], width: usize) -> Option<Q4Matrix> {
        if !whole_rows(values.len(), width) || !width.is_multiple_of(PAIR) {
            return None;
        }
        let blocks = values.len() / BLOCK;
        let mut qs = vec![0u8; values.len() / 2];
        let mut d = vec![0f32; blocks];
        let mut m = vec![0f32; blocks];
        let exact = values
            .par_chunks(PAIR)
            .zip(qs.par_chunks_mut(BLOCK))
            .zip(d.par_chunks_mut(2).zip(m.par_chunks_mut(2)))
            .all(|((v, packed), (d, m))| {
                let (Some(a), Some(b)) = (
                    encode_block(&v[..BLOCK], &mut d[0], &mut m[0]),
                    encode_block(&v[BLOCK..], &mut d[1], &mut m[1]),
                ) else {
                    return false;
                };
                for ((byte, a), b) in packed.iter_mut().zip(a).zip(b) {
                    *byte = a | (b << 4);
                }
                true
            });
        exact.then_some(Q4Matrix {
            out: values.len() / width,
            width,
            qs,
            d,
            m,
        })
    }
}

/// One block's 4-bit values (scale and offset into `d`, `m`); `None` when its values are not
/// on the grid.
pub(super) fn encode_block(v: &[f32], d: &mut f32, m: &mut f32) -> Option<[u8; BLOCK]> {
    let (lo, hi) = v
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    *m = lo;
    *d = (hi - lo) / 15.0;
    let inv = if *d > 0.0 { 1.0 / *d } else { 0.0 };
    let tolerance = EXACT * lo.abs().max(hi.abs());
    let mut q = [0u8; BLOCK];
    for (q, &x) in q.iter_mut().zip(v) {
        *q = ((x - lo) * inv).round().clamp(0.0, 15.0) as u8;
        if (lo + *d * *q as f32 - x).abs() > tolerance {
            return None;
        }
    }
    Some(q)
}

impl BlockMatrix for Q4Matrix {
    type Row<'a> = Q4Row<'a>;

    fn out(&self) -> usize {
        self.out
    }

    fn width(&self) -> usize {
        self.width
    }

    fn row(&self, col: usize) -> Q4Row<'_> {
        let per_row = self.width / BLOCK;
        let blocks = col * per_row..(col + 1) * per_row;
        Q4Row {
            qs: &self.qs[blocks.start * BLOCK / 2..blocks.end * BLOCK / 2],
            d: &self.d[blocks.clone()],
            m: &self.m[blocks],
        }
    }
}

/// One row of a [`Q4Matrix`].
pub struct Q4Row<'a> {
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

impl RowKernel for Q4Row<'_> {
    /// Whether the blocks of this row (whole pairs) and of every activation row are there
    /// to read.
    fn readable(&self, xs: &[ActRow<'_>]) -> bool {
        let blocks = self.d.len();
        blocks.is_multiple_of(2)
            && self.qs.len() >= blocks * BLOCK / 2
            && self.m.len() >= blocks
            && xs
                .iter()
                .all(|x| x.q.len() >= blocks * BLOCK && x.d.len() >= blocks && x.s.len() >= blocks)
    }

    fn dot_scalar(&self, x: ActRow<'_>) -> f32 {
        let value = |i: usize| {
            let (pair, j) = (i / PAIR, i % PAIR);
            let byte = self.qs[pair * BLOCK + j % BLOCK];
            if j < BLOCK {
                byte & 15
            } else {
                byte >> 4
            }
        };
        (0..self.d.len())
            .map(|b| {
                let dot: i32 = (b * BLOCK..(b + 1) * BLOCK)
                    .map(|i| value(i) as i32 * x.q[i] as i32)
                    .sum();
                dot as f32 * self.d[b] * x.d[b] + self.m[b] * x.s[b]
            })
            .sum()
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx2<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R] {
        avx2::dot(self, xs)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! Per block: 32 unsigned values (one nibble of each of a pair's 32 bytes) times the
    //! signed activations, summed in pairs to 16 bits (at most 2·15·127, no saturation) and
    //! to 32 bits, scaled in f32; the offset term per block in scalar f32.

    use super::{ActRow, Q4Row, RowKernel, BLOCK};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub fn dot<const R: usize>(w: &Q4Row<'_>, xs: &[ActRow<'_>; R]) -> [f32; R] {
        let mut out = [0f32; R];
        if !w.readable(xs) {
            return out;
        }
        let (qs, wd, wm) = (w.qs, w.d, w.m);
        // SAFETY: loads read 32 bytes at `p * 32` of `qs` and 32 at `b * 32` of each row, for
        // pairs `p` and blocks `b` inside slices checked above.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let low = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut offset = [0f32; R];
            for pair in 0..wd.len() / 2 {
                let raw = _mm256_loadu_si256(qs.as_ptr().add(pair * BLOCK).cast());
                let halves = [
                    _mm256_and_si256(raw, low),
                    _mm256_and_si256(_mm256_srli_epi16(raw, 4), low),
                ];
                for (half, q) in halves.into_iter().enumerate() {
                    let b = 2 * pair + half;
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
            }
            for ((o, v), off) in out.iter_mut().zip(acc).zip(offset) {
                *o = super::super::simd::hsum(v) + off;
            }
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::blocks::tests::{check, values};
    use super::super::blocks::Act;
    use super::*;

    /// Values on a 4-bit grid per block, as a Q4_1 file's dequantized weights are.
    pub fn on_grid(n: usize) -> Vec<f32> {
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
        let (out, width) = (70, 128);
        let w = on_grid(out * width);
        let m = Q4Matrix::exact(&w, width).expect("values on the grid encode exactly");
        // only the activations' 8-bit rounding is left
        check(&m, &w, 0.01);
    }

    #[test]
    fn values_off_the_grid_are_refused() {
        let width = 128;
        assert!(Q4Matrix::exact(&values(10 * width, 4), width).is_none());
        let mut w = on_grid(10 * width);
        w[40] += 0.01;
        assert!(Q4Matrix::exact(&w, width).is_none());
        assert!(Q4Matrix::exact(&w[..100], 50).is_none());
        // rows of an odd number of blocks are not whole pairs
        assert!(Q4Matrix::exact(&on_grid(2 * 128), 128).is_some());
        assert!(Q4Matrix::exact(&on_grid(2 * 96), 96).is_none());
    }

    /// The SIMD kernel computes what the block-by-block definition does (where the CPU has
    /// AVX2; said when it has not).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernels_agree_with_the_definition() {
        if !super::super::cpu::avx2() {
            println!("AVX2 kernel not run: this CPU lacks AVX2/FMA (or ENGINE_KERNELS caps it)");
            return;
        }
        let width = 192;
        let w = Q4Matrix::exact(&on_grid(3 * width), width).unwrap();
        let x = Act::encode(&values(3 * width, 2), width).unwrap();
        let xs: Vec<_> = (0..3).map(|r| x.row(r)).collect();
        for c in 0..3 {
            let row = w.row(c);
            let want = xs.iter().map(|x| row.dot_scalar(*x));
            let group = [xs[0], xs[1], xs[2]];
            // SAFETY: the CPU has AVX2 and FMA (checked above)
            let avx2 = unsafe { avx2::dot(&row, &group) };
            for (r, want) in want.enumerate() {
                let close = |g: f32| (g - want).abs() <= 1e-4 * want.abs().max(1.0);
                assert!(close(avx2[r]), "{} vs {want}", avx2[r]);
            }
        }
    }
}
