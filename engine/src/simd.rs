//! SIMD pieces the AVX2 kernels (`q8`, `q4`, `attention`) share; callers check `cpu::avx2`.

use std::arch::x86_64::*;

/// The sum of a vector's eight lanes.
///
/// # Safety
/// The CPU must have the features enabled here (`cpu::avx2`).
#[target_feature(enable = "avx2")]
pub fn hsum(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)))
}
