//! Admission: at most `max_num_seqs` requests run; up to `max_waiting` more wait in line;
//! anything beyond is refused at once with 429 rather than queued without bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Admission {
    running: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// Refused: the waiting line is full.
#[derive(Debug)]
pub struct QueueFull;

/// A running slot, released on drop.
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

impl Admission {
    pub fn new(max_num_seqs: usize, max_waiting: usize) -> Self {
        Admission {
            running: Arc::new(Semaphore::new(max_num_seqs)),
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// No running slot is free and the line is full: a request now would get 429.
    pub fn is_full(&self) -> bool {
        self.running.available_permits() == 0 && self.waiting() >= self.max_waiting
    }

    /// Takes a running slot, waiting in line if needed; `on_wait_change` reports the line length.
    pub async fn enter(&self, on_wait_change: impl Fn(usize)) -> Result<Slot, QueueFull> {
        if let Ok(p) = Arc::clone(&self.running).try_acquire_owned() {
            return Ok(Slot(p));
        }
        let joined = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < self.max_waiting).then_some(w + 1)
            });
        let Ok(before) = joined else {
            return Err(QueueFull);
        };
        on_wait_change(before + 1);
        // Leave the line even if this future is dropped (client gone) while waiting.
        struct Leave<'a, F: Fn(usize)>(&'a AtomicUsize, &'a F);
        impl<F: Fn(usize)> Drop for Leave<'_, F> {
            fn drop(&mut self) {
                let now = self.0.fetch_sub(1, Ordering::AcqRel) - 1;
                (self.1)(now);
            }
        }
        let _leave = Leave(&self.waiting, &on_wait_change);
        let permit = Arc::clone(&self.running)
            .acquire_owned()
            .await
            .map_err(|_| QueueFull)?;
        Ok(Slot(permit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_line() {
        let a = Arc::new(Admission::new(1, 1));
        let s1 = a.enter(|_| {}).await.unwrap();
        let a2 = Arc::clone(&a);
        let waiter = tokio::spawn(async move { a2.enter(|_| {}).await.is_ok() });
        let queued = async {
            while a.waiting() == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), queued)
            .await
            .expect("the second request never queued");
        assert!(a.enter(|_| {}).await.is_err(), "line full → refused");
        drop(s1);
        assert!(waiter.await.unwrap());
        assert_eq!(a.waiting(), 0);
    }
}
