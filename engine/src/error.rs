//! The engine's one error type: what failed, in the engine's terms, whatever library did the
//! work underneath (candle's tensor errors are carried, not exposed as the type).

use std::path::PathBuf;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A GGUF file that cannot be read, or not a model this engine runs.
    #[error("{}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },
    /// Shapes, positions or token ids that do not fit together (a caller's or this engine's
    /// mistake, reported instead of panicking).
    #[error("{0}")]
    Invalid(String),
    /// A tensor operation failed underneath (candle).
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The batching loop's thread could not be started.
    #[error("starting the engine thread: {0}")]
    Thread(std::io::Error),
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Returns [`Error::Invalid`] with a formatted message.
#[macro_export]
#[doc(hidden)]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Invalid(format!($($arg)*)))
    };
}
