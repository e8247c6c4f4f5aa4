//! SIMD pieces the decode kernels (`q8`, `q4`, `attention`) share.

use std::arch::x86_64::*;

/// The sum of a vector's eight lanes.
pub fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only operations; AVX2 is enabled for the whole build.
    unsafe {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)))
    }
}

/// Whether this CPU has AVX-512 with VNNI, for the 16-lane kernels of `q8` and `q4` (the
/// build targets AVX2; checked once).
pub fn avx512_vnni() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    })
}

/// `acc` plus, spread over its lanes, `Σ c[b] · e[b]` for every `b < c.len()`: a block
/// matrix's per-block term (an offset or correction times an activation row's per-block
/// sum or scale), added once per weight row instead of once per block in the kernel's loop.
///
/// # Safety
/// The CPU must have AVX-512F, and `e.len() >= c.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn add_block_terms(c: &[f32], e: &[f32], mut acc: __m512) -> __m512 {
    let n = c.len();
    // SAFETY: full loads read 16 floats at `i < n - 15`; the masked tail reads only lanes
    // below `n`; `e` is at least as long as `c` (the caller's contract)
    unsafe {
        let mut i = 0;
        while i + 16 <= n {
            let (a, b) = (
                _mm512_loadu_ps(c.as_ptr().add(i)),
                _mm512_loadu_ps(e.as_ptr().add(i)),
            );
            acc = _mm512_fmadd_ps(a, b, acc);
            i += 16;
        }
        if i < n {
            let mask: __mmask16 = (1u16 << (n - i)) - 1;
            let a = _mm512_maskz_loadu_ps(mask, c.as_ptr().add(i));
            let b = _mm512_maskz_loadu_ps(mask, e.as_ptr().add(i));
            acc = _mm512_fmadd_ps(a, b, acc);
        }
    }
    acc
}

/// A weight row's per-block scales for one pair of blocks as the 16-lane kernels lay a pair
/// out: `d[2p]` in the low eight lanes, `d[2p + 1]` in the high eight.
///
/// # Safety
/// The CPU must have AVX-512F, and `2p + 1 < d.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn pair_scales(d: &[f32], p: usize) -> __m512 {
    // SAFETY: both indices are inside `d` (the caller's contract)
    unsafe {
        _mm512_mask_blend_ps(
            0xFF00,
            _mm512_set1_ps(*d.get_unchecked(2 * p)),
            _mm512_set1_ps(*d.get_unchecked(2 * p + 1)),
        )
    }
}
