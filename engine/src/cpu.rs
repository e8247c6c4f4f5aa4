//! Which kernels this process runs, chosen at run time from the CPU's features: one binary
//! runs on any x86-64 (the portable loops where the CPU lacks AVX2, AVX2 + FMA + F16C where
//! it has them, AVX-512 and AMX above), and a build for another architecture runs the
//! portable loops. Until 2026-12-07 AVX2 was required at compile time and a CPU without it
//! died with SIGILL.
//!
//! `ENGINE_KERNELS` (`portable`, `avx2`, `avx512`, `amx`) caps the level, to force a lower
//! path: the tests run each path the CPU has this way, and an operator can step around a
//! path that misbehaves on some machine. Each level's kernels are tested against the
//! portable definition.

use std::sync::OnceLock;

/// The environment variable that caps the kernel level.
pub const KERNELS_ENV: &str = "ENGINE_KERNELS";

/// Kernel levels, each including those below it.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::EnumString,
    strum::Display,
    strum::EnumIter,
)]
#[strum(serialize_all = "lowercase")]
pub enum Level {
    /// Plain Rust loops (what the compiler makes of them for the target's baseline).
    Portable,
    /// AVX2 with FMA and F16C: the decode kernels (`q4`, `q8`, `blocks`), attention, `exp`.
    Avx2,
    /// AVX-512 (F, BW, VNNI, BF16 where present): 16-lane attention, interleaved 4/8-bit
    /// decode, bf16 prefill.
    Avx512,
    /// AMX tiles for the bf16 prefill.
    Amx,
}

/// The cap from [`KERNELS_ENV`] (none when unset; an unknown value is reported once and
/// ignored).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86-64 has levels to cap
fn cap() -> Level {
    static CAP: OnceLock<Level> = OnceLock::new();
    *CAP.get_or_init(|| match std::env::var(KERNELS_ENV) {
        Err(_) => Level::Amx,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!(
                "{KERNELS_ENV}={v:?} is not one of portable, avx2, avx512, amx: not capping the kernels"
            );
            Level::Amx
        }),
    })
}

/// Whether kernels of `level` may run (the cap allows them; the CPU is asked separately).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn allowed(level: Level) -> bool {
    level <= cap()
}

/// AVX2, FMA and F16C, checked once.
pub fn avx2() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            allowed(Level::Avx2)
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// AVX-512F (with AVX2 below it), for the 16-lane attention kernels.
pub fn avx512f() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            avx2() && allowed(Level::Avx512) && std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// AVX-512 with BW and VNNI, for the interleaved 16-lane kernels of `q8` and `q4`.
pub fn avx512_vnni() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            avx512f()
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// AVX-512 BF16, for the bf16 prefill.
pub fn avx512_bf16() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            avx512f() && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether this CPU has AMX with bf16, the cap allows it, and Linux granted this process the
/// tile state (asked once), for the bf16 prefill's tiles.
pub fn amx() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            avx512_bf16() && allowed(Level::Amx) && has_tiles() && request_tile_state()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the CPU has AMX tiles with bf16 (CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24
/// AMX-TILE), whatever Linux and `ENGINE_KERNELS` allow.
#[cfg(target_arch = "x86_64")]
fn has_tiles() -> bool {
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`);
/// without it the first tile instruction faults.
#[cfg(target_arch = "x86_64")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain system call with integer arguments; it touches no memory of ours
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The highest level in use in this process, for its start-up log and the tests.
pub fn level() -> Level {
    if amx() {
        Level::Amx
    } else if avx512f() {
        Level::Avx512
    } else if avx2() {
        Level::Avx2
    } else {
        Level::Portable
    }
}

/// Every level this CPU has (whatever the cap), lowest first.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
pub fn supported() -> Vec<Level> {
    let mut out = vec![Level::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            out.push(Level::Avx2);
            if has!("avx512f") {
                out.push(Level::Avx512);
                if has!("avx512bf16") && has_tiles() {
                    out.push(Level::Amx);
                }
            }
        }
    }
    out
}
