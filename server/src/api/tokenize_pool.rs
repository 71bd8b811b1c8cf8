//! Where prompts are rendered and tokenized: CPU-bound work that, for a long
//! prompt, peaks at ~90 bytes of memory per byte of text. It runs on actix's
//! blocking threads (never stalling the event loop) but at most `size` at
//! once, so a burst of huge prompts cannot multiply the peak; after a large
//! one the freed heap goes back to the system.

use std::sync::Arc;

use actix_web::web;
use tokio::sync::Semaphore;

use super::error::ApiError;

/// Inputs at least this large hand their freed memory back when done
/// (trimming walks the whole heap: not worth it for everyday prompts).
const TRIM_FROM_BYTES: usize = 1 << 20;

pub struct TokenizePool {
    permits: Arc<Semaphore>,
}

impl TokenizePool {
    /// A pool running at most `size` (at least 1) tasks at once.
    pub fn new(size: usize) -> TokenizePool {
        TokenizePool { permits: Arc::new(Semaphore::new(size.max(1))) }
    }

    /// The default size: half the cores (the engine and HTTP workers need the rest), 1 to 4.
    pub fn default_size() -> usize {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        (cores / 2).clamp(1, 4)
    }

    /// Runs `work` (over an input of `input_bytes`) once a slot is free.
    pub async fn run<T, E>(&self, input_bytes: usize, work: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, ApiError>
    where
        T: Send + 'static,
        E: Into<ApiError> + Send + 'static,
    {
        // The semaphore is never closed, so acquiring only waits. The slot
        // goes with the work: a client that leaves drops this future, not
        // the blocking task, which holds its slot until it ends.
        let slot = self.permits.clone().acquire_owned().await.map_err(|_| ApiError::internal("the tokenizer pool closed"))?;
        let task = move || {
            let _slot = slot;
            let result = work();
            if input_bytes >= TRIM_FROM_BYTES {
                mlx_rs_safe::process_heap::trim();
            }
            result
        };
        match web::block(task).await {
            Ok(result) => result.map_err(Into::into),
            Err(e) => Err(ApiError::internal(format!("the tokenizer task failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[actix_web::test]
    async fn no_more_than_size_tasks_run_at_once() {
        let pool = Arc::new(TokenizePool::new(2));
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks = (0..8).map(|_| {
            let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
            async move {
                pool.run(0, move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), ApiError>(())
                })
                .await
            }
        });
        for r in futures_util::future::join_all(tasks).await {
            r.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    /// A request dropped while its work runs (the client left) keeps its
    /// slot until the work ends: the next one waits for it.
    #[actix_web::test]
    async fn work_whose_request_was_dropped_keeps_its_slot_until_it_ends() {
        let pool = Arc::new(TokenizePool::new(1));
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let work = |running: Arc<AtomicUsize>, most: Arc<AtomicUsize>| {
            move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), ApiError>(())
            }
        };
        let dropped = tokio::time::timeout(Duration::from_millis(50), pool.run(0, work(running.clone(), most.clone()))).await;
        assert!(dropped.is_err(), "the first request should still be running when dropped");
        pool.run(0, work(running.clone(), most.clone())).await.unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 1, "a second tokenization ran beside the dropped one's");
    }
}
