//! The prefill's bf16 panels multiplied with AMX tiles where the CPU has them (Intel Sapphire
//! Rapids and later; checked at run time, and Linux must grant the process the tile state).
//!
//! Why: a prefill chunk is bound by arithmetic ([`super`]), and one `tdpbf16ps`
//! multiplies a 16 × 32 block of activations by a 32 × 16 block of weights (8,192
//! multiply-adds) where `vdpbf16ps` does 32. The panels need no other layout: a panel's pairs
//! are already the tile's rows (sixteen output features' pair of one input pair per 64 bytes),
//! so a weight tile is 16 of a panel's pair rows read with the panel's row stride.
//!
//! Each output is still computed from its own row only, the same way for every row: rows are
//! taken sixteen at a time (the caller pads a last group with zero rows), so a row's result
//! never depends on the rows computed with it (a prompt prefilled in one chunk or several, after a cache hit,
//! gets the same numbers). The sums are the same exact products as the AVX-512 kernel's, added
//! in the tile unit's order, so results differ from that kernel's by f32 rounding; a process
//! uses one kernel or the other throughout.

use super::PANEL;
use std::arch::asm;

/// Input pairs per tile step (a tile row is 64 bytes: 16 pairs).
pub const STEP: usize = 16;

/// Activation rows per tile.
pub const ROWS: usize = 16;

/// The tile shapes: tmm0 and tmm1 the outputs (16 rows × 16 floats), tmm2 the activations
/// (16 rows × 16 pairs), tmm3 and tmm4 the weights (16 pair rows × 16 outputs' pairs).
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = {
    let mut colsb = [0u16; 16];
    let mut rows = [0u8; 16];
    let mut t = 0;
    while t < 5 {
        colsb[t] = 64;
        rows[t] = 16;
        t += 1;
    }
    Config {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb,
        rows,
    }
};

/// One panel `w` (`half` pairs × [`PANEL`]) times the rows of `x` (`half` pairs each) into
/// `o` (`PANEL` floats per row), [`ROWS`] rows at a time (rows past the last whole group are
/// left alone: the caller pads).
///
/// # Safety
/// [`available`] must be true; `half` a multiple of [`STEP`]; `w` at least `half × PANEL`
/// pairs, `o` at least `PANEL` floats per row of `x`.
pub unsafe fn panel(w: &[u32], x: &[u32], half: usize, o: &mut [f32]) {
    let groups = x.len() / half.max(1) / ROWS;
    // SAFETY: the configuration is valid for palette 1; each tile load reads 16 rows of 64
    // bytes at the given stride: activations `x[(r0 + i) * half + p ..][..16]` for rows of
    // whole groups, weights `w[(p + i) * PANEL + h * 16 ..][..16]` for `p + i < half`; the
    // stores write 16 rows of 16 floats at `o[(r0 + i) * PANEL + h * 16]`: inside the lengths
    // the caller promised
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
        for r0 in (0..groups * ROWS).step_by(ROWS) {
            let xs = x.as_ptr().add(r0 * half);
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            let x_stride = half * 4;
            for p in (0..half).step_by(STEP) {
                let a = xs.add(p);
                let b = w.as_ptr().add(p * PANEL);
                asm!(
                    "tileloadd tmm2, [{a} + {xs}*1]",
                    "tileloadd tmm3, [{b} + {ws}*1]",
                    "tileloadd tmm4, [{b} + {ws}*1 + 64]",
                    "tdpbf16ps tmm0, tmm2, tmm3",
                    "tdpbf16ps tmm1, tmm2, tmm4",
                    a = in(reg) a,
                    b = in(reg) b,
                    xs = in(reg) x_stride,
                    ws = in(reg) PANEL * 4,
                    options(nostack, readonly),
                );
            }
            asm!(
                "tilestored [{d} + {s}*1], tmm0",
                "tilestored [{d} + {s}*1 + 64], tmm1",
                d = in(reg) o.as_mut_ptr().add(r0 * PANEL),
                s = in(reg) PANEL * 4,
                options(nostack),
            );
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}
