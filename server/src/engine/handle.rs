//! The engine thread: the server's [`Engine`] runs on a thread of its own and
//! takes commands over a channel, so HTTP handlers never wait on MLX and every
//! MLX call happens on that one thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::memory;
use tokio::sync::watch;

use super::core::{Engine, EngineConfig};
use super::request::Request;
use super::stats::EngineStats;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::LanguageModel;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_queue` requests are already waiting.
    QueueFull,
    /// The engine thread has stopped.
    Stopped,
}

pub(super) enum Command {
    Generate(Box<Request>),
    /// Zero MLX's peak-memory counter (SIGUSR1), so a benchmark reads one phase's peak.
    ResetPeakMemory,
    Shutdown,
}

pub struct EngineHandle {
    tx: Sender<Command>,
    /// Requests submitted and not yet admitted.
    waiting: Arc<AtomicUsize>,
    /// Requests the HTTP layer has begun to read and prepare, not yet submitted.
    arriving: Arc<AtomicUsize>,
    max_queue: usize,
    /// The configuration in force (KV compression fitted to the model).
    pub config: EngineConfig,
    pub stats: Arc<EngineStats>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Why the engine stopped on its own (its distributed group broke down).
    pub failure: Failure,
}

/// Why the engine stopped on its own, once it has: a watch any task can hold.
#[derive(Clone)]
pub struct Failure(watch::Receiver<Option<String>>);

impl Failure {
    /// Resolves with the reason once the engine has stopped on its own (its
    /// distributed group broke down); never while it runs.
    pub async fn wait(&self) -> String {
        let mut failure = self.0.clone();
        let why = match failure.wait_for(Option::is_some).await {
            Ok(why) => why.clone(),
            Err(_) => None,
        };
        match why {
            Some(why) => why,
            // The engine thread ended without a failure: nothing to report, ever.
            None => std::future::pending().await,
        }
    }

    /// Why the engine stopped on its own, if it did.
    pub fn get(&self) -> Option<String> {
        self.0.borrow().clone()
    }
}

/// Loads the model, and says how the engine runs it (the memory plan's limits).
type ModelLoader = Box<dyn FnOnce() -> Result<(Box<dyn LanguageModel>, EngineConfig)> + Send>;

impl EngineHandle {
    /// Starts the engine thread, which loads the model with `load` and builds
    /// the engine; returns once that is done (or failed).
    /// With `group` (rank 0 of a distributed group), every turn is run by
    /// every rank in lockstep (see [`super::lockstep`]).
    pub fn spawn(load: ModelLoader, tokenizer: Arc<Tokenizer>, metrics: Arc<Metrics>, group: Option<Group>) -> Result<EngineHandle> {
        let (tx, rx) = mpsc::channel();
        let (failed, failure) = watch::channel(None);
        let (ready_tx, ready_rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let arriving = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(EngineStats::default());
        let (w, s, engine_metrics, a) = (waiting.clone(), stats.clone(), metrics.clone(), arriving.clone());
        let thread = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                match load().and_then(|(model, config)| Engine::with_queue_counter(model, tokenizer, config, metrics, w)) {
                    Ok(mut engine) => {
                        // One process on a GPU compiles its kernels now, not in a
                        // request (a distributed group's ranks would each need the
                        // same forward passes in step: not there).
                        let on_gpu = mlx_rs_safe::kernels::current_gpu_backend().is_some();
                        if on_gpu && group.as_ref().is_none_or(|g| g.size() <= 1) {
                            match engine.warm_up() {
                                Ok(w) => log::info!(
                                    "engine: warmed up the GPU kernels in {:.1} s{}",
                                    w.took.as_secs_f64(),
                                    if w.compressed_step { " (with a decode step over a compressed cache)" } else { "" }
                                ),
                                Err(e) => log::warn!("engine: warming up failed ({e}); kernels compile on first use"),
                            }
                            crate::kernel_check::log_cache("after warm-up");
                        }
                        let _ = ready_tx.send(Ok(engine.config().clone()));
                        match group {
                            Some(g) if g.size() > 1 => super::lockstep::lead(engine, &s, &engine_metrics, rx, &g, Arc::new(failed)),
                            _ => run(engine, &s, &engine_metrics, rx, &a),
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::Startup(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(config)) => Ok(EngineHandle { tx, waiting, arriving, max_queue: config.max_queue, config, stats, thread: Mutex::new(Some(thread)), failure: Failure(failure) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Startup("the engine thread stopped while loading the model".into())),
        }
    }

    /// Marks a request as on its way (its body being read, its prompt
    /// rendered and tokenized) until the returned guard is dropped, at its
    /// submission or its error: an idle engine woken by one request waits a
    /// moment for the others on their way, so a burst is prefilled together.
    pub fn arriving(&self) -> Arriving {
        self.arriving.fetch_add(1, Ordering::SeqCst);
        Arriving(self.arriving.clone())
    }

    /// Queues a request; its events arrive on `request.events`.
    pub fn submit(&self, request: Request) -> std::result::Result<(), SubmitError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        self.tx.send(Command::Generate(Box::new(request))).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }

    /// Asks the engine to zero MLX's peak-memory counter; the next stats show it.
    pub fn reset_peak_memory(&self) -> std::result::Result<(), SubmitError> {
        self.tx.send(Command::ResetPeakMemory).map_err(|_| SubmitError::Stopped)
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Stops the engine: what is still queued or running ends with an error.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// SIGUSR1: zeroes MLX's peak-memory counter and publishes the stats at once.
pub(super) fn reset_peak_memory(engine: &Engine, stats: &EngineStats) {
    match memory::reset_peak_memory() {
        Ok(()) => log::info!("SIGUSR1: MLX peak memory reset"),
        Err(e) => log::warn!("cannot reset MLX peak memory: {e}"),
    }
    stats.publish(engine.snapshot());
}

/// A request on its way to the engine (see [`EngineHandle::arriving`]).
pub struct Arriving(Arc<AtomicUsize>);

impl Drop for Arriving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The longest an idle engine, woken by a request, waits for others on
/// their way, in milliseconds. Requests sent together reach the engine
/// within a millisecond or two of each other (their bodies read and their
/// prompts tokenized on other threads); left unwaited for, the first is
/// prefilled alone and the rest a prefill call later. A lone request never
/// waits.
const ARRIVAL_WAIT_MS: u64 = 10;

/// [`ARRIVAL_WAIT_MS`], or `MLX_SERVE_ARRIVAL_WAIT_MS` up to a second (read
/// once a process; a loaded machine's tests spread a burst wider; a value
/// near u64::MAX would overflow the deadline).
fn arrival_wait() -> Duration {
    static WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *WAIT.get_or_init(|| Duration::from_millis(crate::kernel_check::tuned("MLX_SERVE_ARRIVAL_WAIT_MS", ARRIVAL_WAIT_MS).min(1000)))
}

/// Takes the requests on their way (`arriving`) as they come, until none is
/// on its way or [`arrival_wait`] has passed; false when the engine must stop.
fn gather(engine: &mut Engine, stats: &EngineStats, metrics: &Metrics, rx: &Receiver<Command>, arriving: &AtomicUsize) -> bool {
    let start = Instant::now();
    let deadline = start + arrival_wait();
    let mut going = true;
    while arriving.load(Ordering::SeqCst) > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        // Short waits: the last request on its way is counted off after it is sent.
        match rx.recv_timeout((deadline - now).min(Duration::from_micros(200))) {
            Ok(c) => {
                if !take(engine, stats, c) {
                    going = false;
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                going = false;
                break;
            }
        }
    }
    metrics.record_engine_time("gather", start.elapsed().as_secs_f64());
    going
}

/// Takes one command; false when the engine must stop.
fn take(engine: &mut Engine, stats: &EngineStats, command: Command) -> bool {
    match command {
        Command::Generate(r) => engine.enqueue(*r),
        Command::ResetPeakMemory => reset_peak_memory(engine, stats),
        Command::Shutdown => return false,
    }
    true
}

/// The thread's loop: turns while there is work, blocking on the channel only
/// when there is none.
fn run(mut engine: Engine, stats: &EngineStats, metrics: &Metrics, rx: Receiver<Command>, arriving: &AtomicUsize) {
    stats.publish(engine.snapshot());
    'serve: loop {
        if engine.is_idle() {
            let Ok(c) = rx.recv() else { break };
            if !take(&mut engine, stats, c) || !gather(&mut engine, stats, metrics, &rx, arriving) {
                break;
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => {
                    if !take(&mut engine, stats, c) {
                        break 'serve;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => break 'serve,
            }
        }
        engine.step();
        stats.publish(engine.snapshot());
    }
    engine.abandon_all("the server is shutting down");
}
