//! Reading a candle tensor's values as a plain slice, which every kernel here works on.

use crate::{bail, Result};
use candle_core::Tensor;

/// Runs `f` on the values of a contiguous tensor on the CPU.
pub(crate) fn with_slice<T: candle_core::WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        bail!("a tensor not on the CPU");
    };
    let all = cpu.as_slice::<T>()?;
    match layout.contiguous_offsets().and_then(|(a, b)| all.get(a..b)) {
        Some(values) => Ok(f(values)),
        None => bail!("a tensor not contiguous"),
    }
}
