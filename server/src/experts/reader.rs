//! `ExpertReader`: the one place routed-expert bytes come from. A pool of
//! reader threads, each with its own file handles, takes every read a layer
//! needs at once (queue depth = threads), reads around the page cache, checks
//! float tensors for NaN/infinity (the load-time check streamed experts skip),
//! and hands back MLX arrays. The byte and read counters are updated here from
//! what each read call returned, nowhere else.
//!
//! On CUDA each array's buffer is advised to stay in host memory, mapped for
//! the GPU ([`managed_memory::keep_on_host`]): it is written here once and
//! read once, by the kernel that copies it into its layer's pool or staging
//! set. Left to migrate, its pages fault back to the host for this copy and
//! over to the GPU for that one (`MLX_SERVE_EXPERT_STAGING=managed` leaves
//! them so, for comparison).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use mlx_rs_safe::io::uncached::{self, DIRECT_IO_ALIGN};
use mlx_rs_safe::{managed_memory, Array, Dtype};

use super::counters::{add_seconds, ExpertCounters};
use crate::error::{Error, Result};

/// How expert reads reach the disk (`--expert-io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT (Linux) / F_NOCACHE (macOS): every read goes to the device.
    Direct,
    /// Plain reads without read-ahead, each range dropped from the page cache
    /// afterwards (POSIX_FADV_DONTNEED), so a later read of it is a disk read.
    Buffered,
}

impl IoMode {
    pub fn parse(s: &str) -> Result<IoMode> {
        match s {
            "direct" => Ok(IoMode::Direct),
            "buffered" => Ok(IoMode::Buffered),
            _ => Err(Error::Config(format!("--expert-io must be direct or buffered, got {s:?}"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
        }
    }
}

/// Where one expert's slab of one tensor lies in a weights file.
#[derive(Debug, Clone)]
pub struct Region {
    pub file: Arc<PathBuf>,
    pub offset: u64,
    pub len: usize,
}

/// One read: a region, the array it becomes, and what to call it in errors.
#[derive(Debug, Clone)]
pub struct ReadJob {
    pub region: Region,
    pub shape: Vec<i32>,
    pub dtype: Dtype,
    /// e.g. "model.layers.3.mlp.switch_mlp.up_proj.scales, expert 17".
    pub what: String,
}

struct Task {
    job: ReadJob,
    index: usize,
    reply: mpsc::Sender<(usize, Result<Array>)>,
}

pub struct ExpertReader {
    queue: Mutex<Option<mpsc::Sender<Task>>>,
    workers: Vec<JoinHandle<()>>,
    mode: IoMode,
    counters: ExpertCounters,
}

impl ExpertReader {
    /// Starts `threads` readers over `files`. `Direct` falls back to `Buffered`
    /// (with a warning) where the file system refuses O_DIRECT.
    pub fn start(files: &[PathBuf], requested: IoMode, threads: usize, counters: ExpertCounters) -> Result<ExpertReader> {
        let mode = match requested {
            IoMode::Direct => match files.iter().try_for_each(|f| probe_direct(f)) {
                Ok(()) => IoMode::Direct,
                Err((file, e)) => {
                    log::warn!("expert streaming: {} refuses direct I/O ({e}); reading buffered, dropping each range from the page cache", file.display());
                    IoMode::Buffered
                }
            },
            IoMode::Buffered => IoMode::Buffered,
        };
        counters.set_io_mode(mode.name());
        let keep_on_host = keep_slabs_on_host();
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                let counters = counters.clone();
                std::thread::Builder::new()
                    .name(format!("expert-reader-{i}"))
                    .spawn(move || Worker { mode, keep_on_host, counters, files: HashMap::new(), buf: Vec::new() }.run(&rx))
                    .map_err(|e| Error::Startup(format!("starting an expert reader thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ExpertReader { queue: Mutex::new(Some(tx)), workers, mode, counters })
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    pub fn counters(&self) -> &ExpertCounters {
        &self.counters
    }

    /// Reads every job at once (one queue of all of them, served by all
    /// threads) and returns their arrays in order. The first failure is
    /// returned once all reads ended.
    pub fn read_all(&self, jobs: Vec<ReadJob>) -> Result<Vec<Array>> {
        self.submit(jobs)?.wait()
    }

    /// Queues every job and returns at once: the reads go on while the caller
    /// computes; [`PendingReads::wait`] collects them.
    pub fn submit(&self, jobs: Vec<ReadJob>) -> Result<PendingReads> {
        let n = jobs.len();
        let (reply, replies) = mpsc::channel();
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let queue = queue.as_ref().ok_or(Error::Internal("the expert readers have stopped"))?;
        for (index, job) in jobs.into_iter().enumerate() {
            queue.send(Task { job, index, reply: reply.clone() }).map_err(|_| Error::Internal("the expert readers have stopped"))?;
        }
        Ok(PendingReads { n, replies, counters: self.counters.clone() })
    }
}

/// Reads queued by [`ExpertReader::submit`] and not yet collected. Dropped
/// uncollected, the reads still finish (and are counted); their arrays are
/// freed as they arrive.
pub struct PendingReads {
    n: usize,
    replies: mpsc::Receiver<(usize, Result<Array>)>,
    counters: ExpertCounters,
}

impl PendingReads {
    /// Waits for every read, counting the time spent waiting as stall, and
    /// returns the arrays in job order (or the first failure).
    pub fn wait(self) -> Result<Vec<Array>> {
        let start = Instant::now();
        let mut out: Vec<Option<Array>> = (0..self.n).map(|_| None).collect();
        let mut first_error = None;
        for _ in 0..self.n {
            let (index, result) = self.replies.recv().map_err(|_| Error::Internal("an expert reader thread died"))?;
            match result {
                Ok(a) => out[index] = Some(a),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.counters.record_stall(start.elapsed().as_secs_f64());
        if let Some(e) = first_error {
            return Err(e);
        }
        out.into_iter().map(|a| a.ok_or(Error::Internal("an expert read gave no reply"))).collect()
    }
}

impl Drop for ExpertReader {
    fn drop(&mut self) {
        // Closing the queue ends every worker's loop.
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Opens `file` for direct I/O and reads its first block, which is where a file
/// system that accepts the flag but not the reads says so.
fn probe_direct(file: &Path) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    let fail = |e| (file.to_path_buf(), e);
    let f = uncached::open_direct(file).map_err(fail)?;
    let mut buf = Vec::new();
    let block = aligned(&mut buf, DIRECT_IO_ALIGN);
    f.read_at(block, 0).map(|_| ()).map_err(fail)
}

/// A `len`-byte window of `buf` whose start is aligned for direct I/O.
fn aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len + DIRECT_IO_ALIGN {
        buf.resize(len + DIRECT_IO_ALIGN, 0);
    }
    let shift = (DIRECT_IO_ALIGN - buf.as_ptr() as usize % DIRECT_IO_ALIGN) % DIRECT_IO_ALIGN;
    &mut buf[shift..shift + len]
}

/// Whether read slabs are advised to stay in host memory (CUDA), unless
/// `MLX_SERVE_EXPERT_STAGING=managed` asks to leave them where MLX puts them.
fn keep_slabs_on_host() -> bool {
    match std::env::var("MLX_SERVE_EXPERT_STAGING").as_deref() {
        Ok("managed") => {
            log::info!("expert streaming: MLX_SERVE_EXPERT_STAGING=managed: read slabs left to migrate between host and GPU");
            false
        }
        Ok("host") | Err(_) => true,
        Ok(other) => {
            log::warn!("MLX_SERVE_EXPERT_STAGING={other:?} is neither host nor managed; keeping read slabs on the host");
            true
        }
    }
}

struct Worker {
    mode: IoMode,
    /// [`keep_slabs_on_host`].
    keep_on_host: bool,
    counters: ExpertCounters,
    files: HashMap<Arc<PathBuf>, Arc<File>>,
    /// Reused between reads: the aligned bounce buffer.
    buf: Vec<u8>,
}

impl Worker {
    fn run(mut self, rx: &Mutex<mpsc::Receiver<Task>>) {
        loop {
            let task = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                Ok(t) => t,
                Err(_) => return,
            };
            let result = self.read(&task.job).map_err(|message| Error::ModelFile {
                file: task.job.region.file.display().to_string(),
                message: format!("reading {}: {message}", task.job.what),
            });
            // The requester only stops listening after an error of its own.
            let _ = task.reply.send((task.index, result));
        }
    }

    fn file(&mut self, path: &Arc<PathBuf>) -> std::result::Result<Arc<File>, String> {
        if !self.files.contains_key(path) {
            let file = match self.mode {
                IoMode::Direct => uncached::open_direct(path),
                IoMode::Buffered => File::open(path.as_path()).and_then(|f| uncached::advise_random(&f).map(|()| f)),
            }
            .map_err(|e| format!("cannot open: {e}"))?;
            self.files.insert(path.clone(), Arc::new(file));
        }
        Ok(self.files[path].clone())
    }

    /// One job's array, its bytes counted as read or as failed.
    fn read(&mut self, job: &ReadJob) -> std::result::Result<Array, String> {
        let result = self.read_slab(job);
        let len = job.region.len as u64;
        match &result {
            Ok(_) => self.counters.bytes_read.inc_by(len),
            Err(_) => self.counters.failed_bytes.inc_by(len),
        };
        result
    }

    fn read_slab(&mut self, job: &ReadJob) -> std::result::Result<Array, String> {
        let Region { file, offset, len } = &job.region;
        let (offset, len) = (*offset, *len);
        // O_DIRECT on Linux reads whole aligned blocks: the region widened to them.
        let (start, span) = if self.mode == IoMode::Direct && uncached::direct_needs_alignment() {
            let a = DIRECT_IO_ALIGN as u64;
            let start = offset / a * a;
            (start, ((offset + len as u64).div_ceil(a) * a - start) as usize)
        } else {
            (offset, len)
        };
        let skip = (offset - start) as usize;
        let f = self.file(file)?;
        let mut buf = std::mem::take(&mut self.buf);
        let began = Instant::now();
        let got = read_span(&f, start, aligned(&mut buf, span), &self.counters);
        let read = Instant::now();
        add_seconds(&self.counters.read_call_seconds, (read - began).as_secs_f64());
        let result = got.and_then(|got| {
            if got < skip + len {
                return Err(format!("the file ends {} bytes into the {len}-byte tensor slab at offset {offset}: truncated?", got.saturating_sub(skip)));
            }
            let bytes = &aligned(&mut buf, span)[skip..skip + len];
            check_finite(bytes, job.dtype)?;
            let array = Array::from_bytes(bytes, &job.shape, job.dtype).map_err(|e| e.to_string());
            if let (Ok(a), true) = (&array, self.keep_on_host) {
                self.stage_on_host(a, len);
            }
            add_seconds(&self.counters.array_seconds, read.elapsed().as_secs_f64());
            array
        });
        self.buf = buf;
        if self.mode == IoMode::Buffered {
            // Whole pages: DONTNEED keeps pages the range only partly covers.
            let page = DIRECT_IO_ALIGN as u64;
            let from = offset / page * page;
            let to = (offset + len as u64).div_ceil(page) * page;
            let _ = uncached::drop_cached(&f, from, to - from);
        }
        result
    }

    /// [`managed_memory::keep_on_host`] for a slab just read, counted. The
    /// advice only moves pages, so a failure costs speed, not the read: it
    /// is logged (once) and the slab handed back as it is.
    fn stage_on_host(&self, array: &Array, len: usize) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        match managed_memory::keep_on_host(array) {
            Ok(true) => {
                self.counters.host_staged_bytes.inc_by(len as u64);
            }
            Ok(false) => {}
            Err(e) => WARNED.call_once(|| log::warn!("expert streaming: read slabs stay in migrating managed memory: {e}")),
        }
    }
}

/// Fills `dst` from `file` at `start` (short only at the end of the file);
/// returns the bytes read, counting each call.
fn read_span(file: &File, start: u64, dst: &mut [u8], counters: &ExpertCounters) -> std::result::Result<usize, String> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], start + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                counters.reads.inc();
                counters.disk_bytes.inc_by(n as u64);
                done += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read of {} bytes at offset {} failed: {e}", dst.len() - done, start + done as u64)),
        }
    }
    Ok(done)
}

/// Refuses NaN and infinity in a float slab: the check every other weight gets
/// at load (hardening), done here because streamed experts are never loaded whole.
fn check_finite(bytes: &[u8], dtype: Dtype) -> std::result::Result<(), String> {
    let bad = match dtype {
        Dtype::Float32 => bytes.chunks_exact(4).any(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000),
        Dtype::Bfloat16 => bytes.chunks_exact(2).any(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
        Dtype::Float16 => bytes.chunks_exact(2).any(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        _ => false,
    };
    if bad {
        Err("holds NaN or infinite values".into())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_check_catches_each_float_format() {
        assert!(check_finite(&f32::NAN.to_le_bytes(), Dtype::Float32).is_err());
        assert!(check_finite(&f32::INFINITY.to_le_bytes(), Dtype::Float32).is_err());
        assert!(check_finite(&1.5f32.to_le_bytes(), Dtype::Float32).is_ok());
        assert!(check_finite(&0x7fc0u16.to_le_bytes(), Dtype::Bfloat16).is_err());
        assert!(check_finite(&0x3f80u16.to_le_bytes(), Dtype::Bfloat16).is_ok());
        assert!(check_finite(&0x7c00u16.to_le_bytes(), Dtype::Float16).is_err());
        assert!(check_finite(&0x3c00u16.to_le_bytes(), Dtype::Float16).is_ok());
        // Packed integers are not floats: every bit pattern is valid.
        assert!(check_finite(&u32::MAX.to_le_bytes(), Dtype::Uint32).is_ok());
    }

    /// Slabs come back as the file holds them, read by a kernel on the
    /// default device (the GPU's read of a host-kept buffer, on CUDA), twice
    /// (the second time into buffers MLX's cache hands back); on CUDA every
    /// slab of at least 16 KiB is counted as kept on the host, elsewhere none.
    #[test]
    fn slabs_read_back_exactly_and_stay_on_the_host_only_on_cuda() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experts.bin");
        let slab = 64 * 1024;
        let bytes: Vec<u8> = (0..3 * slab).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let counters = ExpertCounters::default();
        let reader = ExpertReader::start(std::slice::from_ref(&path), IoMode::Buffered, 2, counters.clone()).unwrap();
        let file = Arc::new(path);
        let job = |i: usize, len: usize| ReadJob {
            region: Region { file: file.clone(), offset: (i * slab) as u64, len },
            shape: vec![len as i32],
            dtype: Dtype::Uint8,
            what: format!("slab {i}"),
        };
        for _ in 0..2 {
            let jobs = vec![job(0, slab), job(1, slab), job(2, 1024)];
            let arrays = reader.read_all(jobs.clone()).unwrap();
            for (a, j) in arrays.iter().zip(&jobs) {
                let on_device = mlx_rs_safe::ops::add(a, &Array::from_slice(&[0u8], &[1]).unwrap()).unwrap();
                let from = j.region.offset as usize;
                assert_eq!(on_device.to_vec::<u8>().unwrap(), &bytes[from..from + j.region.len], "{}", j.what);
            }
        }
        let expected = if mlx_rs_safe::kernels::gpu_backend() == Some("cuda") { 2 * 2 * slab as u64 } else { 0 };
        assert_eq!(counters.host_staged_bytes.get(), expected, "slabs kept on the host");
        assert_eq!(counters.bytes_read(), 2 * (2 * slab + 1024) as u64);
    }

    #[test]
    fn aligned_windows_start_on_a_block() {
        let mut buf = Vec::new();
        let w = aligned(&mut buf, 10_000);
        assert_eq!(w.len(), 10_000);
        assert_eq!(w.as_ptr() as usize % DIRECT_IO_ALIGN, 0);
    }
}
