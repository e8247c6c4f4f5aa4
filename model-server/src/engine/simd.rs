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

/// Whether this CPU has AVX-512F, for the 16-lane attention kernels (checked once).
pub fn avx512f() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
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
