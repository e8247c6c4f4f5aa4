//! Prefill weight matrices in bf16, multiplied with AVX-512 BF16 where the CPU has it.
//!
//! A prefill chunk multiplies hundreds of rows by every weight matrix, so it is bound by
//! arithmetic, not by reading the weights: candle's f32 gemm (AVX2 FMA, 16 multiply-adds per
//! cycle and core) was two thirds of a prefill. `vdpbf16ps` does 32 per instruction, two
//! products per f32 lane. Measured on this project's 2-core Zen 4, 256 rows against a
//! 576 × 3072 matrix: 141–186 GMAC/s against candle's f32 gemm's 78–89 (the 8-bit decode
//! kernels' `multiply` ran at 33–37: their per-block scales cost two more instructions per
//! multiply-and-sum); 1040 prompt tokens prefill at 650–720 tokens/s instead of 390–470.
//! The weights take half the memory of the f32 copies they replace (~0.2 GB for SmolLM2).
//! bf16 keeps 8 bits of mantissa: a Q4_1 weight moves by at most 2⁻⁹ of itself (its 4-bit
//! grid step is ~7 % of its block's range), an activation likewise, per value rather than
//! per 32-value block as the decode kernels' 8-bit activations are.

//! Layout: the matrix's rows (output features) in panels of [`PANEL`]; within a panel, for
//! each pair of input features `2p, 2p+1`, the panel's 32 rows' two values side by side, so
//! one 64-byte load gives sixteen output features' pair, and a broadcast activation pair
//! multiplies it. Each output is one lane's sum over the pairs in order, whatever the number
//! of rows multiplied: a row's result never depends on the rows computed with it (a prompt
//! prefilled in one chunk or in several, after a cache hit, gets the same numbers).
//!
//! On CPUs without AVX-512 BF16 the prefill keeps candle's f32 matmul ([`Dense`]).

use crate::{bail, Result};
use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod amx;

/// Output features per panel: two 16-lane registers.
pub const PANEL: usize = 32;

/// Activation rows multiplied together by one kernel call, each panel's pair loaded once
/// for all of them.
const ROWS_AT_ONCE: usize = 8;

/// A weight matrix `[out, width]` in bf16 panels.
pub struct Bf16Matrix {
    out: usize,
    width: usize,
    /// `panels × width/2 × PANEL` pairs, each two bf16 bits `lo | hi << 16`.
    pairs: Vec<u32>,
}

/// The bits of `x` rounded to the nearest bf16 (ties to even), as `vcvtne2ps2bf16` rounds.
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7FFF + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// Two values as one bf16 pair (`a` in the low half).
fn pair(a: f32, b: f32) -> u32 {
    bf16_bits(a) as u32 | (bf16_bits(b) as u32) << 16
}

impl Bf16Matrix {
    /// Packs `values` (`out` rows of `width`, an even number) into panels; `None` when the
    /// shape does not fit.
    pub fn new(values: &[f32], width: usize) -> Option<Bf16Matrix> {
        if width == 0 || !width.is_multiple_of(2) || !values.len().is_multiple_of(width) {
            return None;
        }
        let out = values.len() / width;
        let panels = out.div_ceil(PANEL);
        let per_panel = width / 2 * PANEL;
        let mut pairs = vec![0u32; panels * per_panel];
        pairs
            .par_chunks_mut(per_panel)
            .enumerate()
            .for_each(|(panel, dst)| {
                for (p, lanes) in dst.chunks_mut(PANEL).enumerate() {
                    for (c, lane) in lanes.iter_mut().enumerate() {
                        let row = panel * PANEL + c;
                        if row < out {
                            let at = row * width + 2 * p;
                            *lane = pair(values[at], values[at + 1]);
                        }
                    }
                }
            });
        Some(Bf16Matrix { out, width, pairs })
    }

    pub fn out(&self) -> usize {
        self.out
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// `x · Wᵀ` for `x.len() / width` rows, row-major `[rows, out]`: the panels spread over
    /// the cores, each multiplied with every row while it is in cache.
    ///
    /// # Errors
    /// When `x` is not whole rows of this matrix's width, or the CPU lacks AVX-512 BF16.
    pub fn multiply(&self, x: &[f32]) -> Result<Vec<f32>> {
        self.multiply_by(x, crate::cpu::amx())
    }

    /// [`Self::multiply`] through AMX tiles (`tiles`, where the width is whole tile steps) or
    /// the AVX-512 kernel; a process uses one throughout (tests compare both).
    fn multiply_by(&self, x: &[f32], tiles: bool) -> Result<Vec<f32>> {
        if !available() {
            bail!("this CPU has no AVX-512 BF16");
        }
        if !x.len().is_multiple_of(self.width) {
            bail!("{} values are not rows of {}", x.len(), self.width);
        }
        let rows = x.len() / self.width;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let half = self.width / 2;
        // SAFETY: the CPU has AVX-512F and BF16 (checked above)
        #[cfg(target_arch = "x86_64")]
        let mut xb = unsafe { avx512::to_pairs(x) };
        #[cfg(not(target_arch = "x86_64"))]
        let mut xb: Vec<u32> = x.chunks_exact(2).map(|v| pair(v[0], v[1])).collect();
        // tiles take whole groups of rows: zero rows pad the last one (their outputs are not
        // copied out), once for all panels
        #[cfg(target_arch = "x86_64")]
        let tile_rows = (tiles && half.is_multiple_of(amx::STEP)).then_some(amx::ROWS);
        #[cfg(not(target_arch = "x86_64"))]
        let tile_rows: Option<usize> = {
            let _ = tiles; // no tiles on other architectures
            None
        };
        let computed = tile_rows.map_or(rows, |g| rows.next_multiple_of(g));
        xb.resize(computed * half, 0);
        let per_panel = half * PANEL;
        let panels = self.pairs.len() / per_panel.max(1);
        // panel-major first (each task's strip contiguous), then rows
        let mut strips = vec![0f32; panels * computed * PANEL];
        strips
            .par_chunks_mut(computed * PANEL)
            .zip(self.pairs.par_chunks(per_panel))
            .for_each(|(strip, w)| {
                if tile_rows.is_some() {
                    // SAFETY: AMX is there (`multiply`'s check, or a test's), `half` is whole
                    // tile steps and `xb` whole groups of rows (both above); `w` is one panel
                    // and `strip` holds PANEL floats per row of `xb`
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        amx::panel(w, &xb, half, strip)
                    };
                    return;
                }
                for (x, o) in xb
                    .chunks(ROWS_AT_ONCE * half)
                    .zip(strip.chunks_mut(ROWS_AT_ONCE * PANEL))
                {
                    group(w, x, half, o);
                }
            });
        let mut y = vec![0f32; rows * self.out];
        for (panel, strip) in strips.chunks(computed * PANEL).enumerate() {
            let first = panel * PANEL;
            let cols = PANEL.min(self.out - first);
            for (r, s) in strip.chunks(PANEL).take(rows).enumerate() {
                y[r * self.out + first..r * self.out + first + cols].copy_from_slice(&s[..cols]);
            }
        }
        Ok(y)
    }
}

/// One panel `w` times a group of up to [`ROWS_AT_ONCE`] rows `x` (`half` pairs each) into
/// `o` (`PANEL` per row).
fn group(w: &[u32], x: &[u32], half: usize, o: &mut [f32]) {
    let rows = x.len() / half.max(1);
    match rows {
        1 => kernel::<1>(w, x, half, o),
        2 => kernel::<2>(w, x, half, o),
        3 => kernel::<3>(w, x, half, o),
        4 => kernel::<4>(w, x, half, o),
        5 => kernel::<5>(w, x, half, o),
        6 => kernel::<6>(w, x, half, o),
        7 => kernel::<7>(w, x, half, o),
        _ => kernel::<8>(w, x, half, o),
    }
}

fn kernel<const R: usize>(w: &[u32], x: &[u32], half: usize, o: &mut [f32]) {
    if w.len() < half * PANEL || x.len() < R * half || o.len() < R * PANEL {
        return;
    }
    // SAFETY: `multiply` runs only where `available()`; the lengths are checked above
    #[cfg(target_arch = "x86_64")]
    unsafe {
        avx512::kernel::<R>(w, x, half, o)
    }
}

/// Whether this CPU multiplies bf16 pairs (AVX-512F and BF16; checked once, capped by
/// `ENGINE_KERNELS`).
pub fn available() -> bool {
    super::cpu::avx512_bf16()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::PANEL;
    use std::arch::x86_64::*;

    /// `o[r][c] = Σ_p x[r][p] · w[p][c]` over the `half` pairs, both of a pair's products in
    /// one lane.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BF16; `w` holds `half × PANEL` pairs, `x` `R × half`,
    /// `o` `R × PANEL` floats.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn kernel<const R: usize>(w: &[u32], x: &[u32], half: usize, o: &mut [f32]) {
        // SAFETY: loads read 16 pairs at `p * PANEL` and `p * PANEL + 16` of `w` and one at
        // `r * half + p` of `x` for `p < half`, `r < R`; stores write 16 floats at
        // `r * PANEL` and `r * PANEL + 16` of `o`: inside the lengths the caller checked
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for p in 0..half {
                let lo = _mm512_loadu_si512(w.as_ptr().add(p * PANEL).cast());
                let hi = _mm512_loadu_si512(w.as_ptr().add(p * PANEL + 16).cast());
                let (lo, hi) = (m512bh(lo), m512bh(hi));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xr = m512bh(_mm512_set1_epi32(*x.get_unchecked(r * half + p) as i32));
                    a[0] = _mm512_dpbf16_ps(a[0], xr, lo);
                    a[1] = _mm512_dpbf16_ps(a[1], xr, hi);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(r * PANEL), a[0]);
                _mm512_storeu_ps(o.as_mut_ptr().add(r * PANEL + 16), a[1]);
            }
        }
    }

    /// `x` (an even number of values) as bf16 pairs, 32 values per instruction; the same
    /// rounding as [`super::pair`].
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn to_pairs(x: &[f32]) -> Vec<u32> {
        let mut out = vec![0u32; x.len() / 2];
        let whole = x.len() / 32;
        // SAFETY: loads read 32 floats at `32i < 32 · whole ≤ x.len()`, stores write 16
        // pairs at `16i`, inside `out` (half of `x`'s length)
        unsafe {
            for i in 0..whole {
                let lo = _mm512_loadu_ps(x.as_ptr().add(32 * i));
                let hi = _mm512_loadu_ps(x.as_ptr().add(32 * i + 16));
                let b: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(out.as_mut_ptr().add(16 * i).cast(), b);
            }
        }
        for (o, v) in out[16 * whole..]
            .iter_mut()
            .zip(x[32 * whole..].chunks_exact(2))
        {
            *o = super::pair(v[0], v[1]);
        }
        out
    }

    /// The same 512 bits, typed as 32 bf16 values.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn m512bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512-bit vectors of plain bits
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }
}

/// A prefill weight matrix: bf16 panels where the CPU multiplies them, else candle's f32.
pub enum Dense {
    Bf16(Bf16Matrix),
    F32(QMatMul),
}

impl Dense {
    /// From a dense f32 `[out, in]` tensor.
    pub fn new(w: Tensor) -> Result<Dense> {
        if available() {
            let (_, width) = w.dims2()?;
            let values = w.flatten_all()?.to_vec1::<f32>()?;
            if let Some(m) = Bf16Matrix::new(&values, width) {
                return Ok(Dense::Bf16(m));
            }
        }
        Ok(Dense::F32(QMatMul::Tensor(w)))
    }

    /// `x · Wᵀ` for `x` `[1, n, in]` (contiguous), `[1, n, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Dense::F32(m) => Ok(m.forward(x)?),
            Dense::Bf16(m) => {
                let (b, n, _) = x.dims3()?;
                let x = x.contiguous()?;
                let y = crate::tensor::with_slice(&x, |v: &[f32]| m.multiply(v))??;
                Ok(Tensor::from_vec(y, (b, n, m.out()), x.device())?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_bf16(bits: u16) -> f32 {
        f32::from_bits((bits as u32) << 16)
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1999) as f32 / 999.5 - 1.0)
            .collect()
    }

    #[test]
    fn rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even (1.0)
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        assert_eq!(from_bf16(bf16_bits(-2.5)), -2.5);
        #[cfg(target_arch = "x86_64")]
        if available() {
            // the instruction's rounding is the scalar one, ties included
            let mut x = values(100, 5);
            x.extend([1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -0.0, 1e-40, 3e38]);
            x.push(0.0);
            // SAFETY: the CPU has the features (checked above)
            let simd = unsafe { avx512::to_pairs(&x) };
            let scalar: Vec<u32> = x.chunks(2).map(|v| pair(v[0], v[1])).collect();
            assert_eq!(simd, scalar);
        }
    }

    /// The product is the exact sum of the bf16-rounded values' products (within f32
    /// summation), for every group size and a width and output count that are not whole
    /// panels; and each row equals that row multiplied alone, bit for bit.
    #[test]
    fn matches_the_rounded_product_and_rows_are_independent() {
        if !available() {
            println!(
                "bf16 kernels not run: this CPU lacks AVX-512 BF16 (or ENGINE_KERNELS caps it)"
            );
            return;
        }
        let (out, width) = (70, 96);
        let w = values(out * width, 0);
        let m = Bf16Matrix::new(&w, width).unwrap();
        let round = |v: f32| from_bf16(bf16_bits(v)) as f64;
        // both kernels where the CPU has AMX; rows that are not whole groups of 8 or 16
        #[cfg(target_arch = "x86_64")]
        let kernels = [false, crate::cpu::amx()];
        if !kernels[1] {
            println!(
                "AMX tiles not run: this CPU (or Linux, or ENGINE_KERNELS) does not allow them"
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let kernels = [false, false];
        for (tiles, rows) in kernels
            .into_iter()
            .flat_map(|t| [1, 3, 8, 9, 16, 20, 33].map(|r| (t, r)))
        {
            let x = values(rows * width, rows);
            let y = m.multiply_by(&x, tiles).unwrap();
            assert_eq!(y.len(), rows * out);
            for r in 0..rows {
                let alone = m
                    .multiply_by(&x[r * width..(r + 1) * width], tiles)
                    .unwrap();
                assert_eq!(&y[r * out..(r + 1) * out], &alone[..], "row {r} of {rows}");
                for c in 0..out {
                    let want: f64 = (0..width)
                        .map(|i| round(w[c * width + i]) * round(x[r * width + i]))
                        .sum();
                    let got = y[r * out + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{rows} rows (tiles: {tiles}), [{r}, {c}]: {got} vs {want}"
                    );
                }
            }
        }
        assert!(m.multiply(&[0.0; 95]).is_err());
        assert!(m.multiply(&[]).unwrap().is_empty());
        assert!(Bf16Matrix::new(&[0.0; 99], 33).is_none());
    }
}
