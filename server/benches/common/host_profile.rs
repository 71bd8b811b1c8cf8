//! Where a bench's host time goes, by function: the process's threads
//! sampled while they run (`pprof`: a SIGPROF timer over the process's CPU
//! time, each sample's stack unwound and named from the libraries' symbol
//! tables, MLX's among them). The GPU machine has no perf, gdb or Nsight
//! Systems; this needs nothing there but the bench itself.

use std::collections::{HashMap, HashSet};

use super::Res;

/// Samples every thread's stack `hz` times a second of CPU time from
/// [`HostProfile::start`] until [`HostProfile::print`].
pub struct HostProfile(pprof::ProfilerGuard<'static>);

/// One thread's samples: by the function a sample was in (self), and by
/// each function anywhere on its stack (inclusive, counted once a sample).
#[derive(Default)]
struct ThreadSamples {
    total: isize,
    own: HashMap<String, isize>,
    under: HashMap<String, isize>,
}

impl HostProfile {
    pub fn start(hz: i32) -> Res<HostProfile> {
        // Unwinding from inside libc's and the dynamic loader's own frames is
        // what pprof's authors found to crash; their samples are dropped.
        let guard = pprof::ProfilerGuardBuilder::default().frequency(hz).blocklist(&["libc", "libgcc", "pthread", "vdso", "ld-linux"]).build()?;
        Ok(HostProfile(guard))
    }

    /// Prints, for each thread with at least 5% of the samples, its `top`
    /// functions by self and by inclusive samples, as Markdown.
    pub fn print(self, top: usize) -> Res<()> {
        let report = self.0.report().build()?;
        let mut threads: HashMap<String, ThreadSamples> = HashMap::new();
        for (frames, &count) in &report.data {
            // Threads inherit the process's name: its id tells them apart.
            let thread = threads.entry(format!("{} (id {})", frames.thread_name, frames.thread_id)).or_default();
            thread.total += count;
            // Innermost frame first; an inlined function before the one it is inlined in.
            let names: Vec<String> = frames.frames.iter().flatten().map(|s| short(&s.name())).collect();
            if let Some(first) = names.first() {
                *thread.own.entry(first.clone()).or_default() += count;
            }
            for name in names.iter().collect::<HashSet<_>>() {
                *thread.under.entry(name.clone()).or_default() += count;
            }
        }
        let all: isize = threads.values().map(|t| t.total).sum();
        let mut order: Vec<_> = threads.into_iter().filter(|(_, t)| t.total * 20 >= all).collect();
        order.sort_by_key(|(_, t)| -t.total);
        for (name, t) in order {
            println!("\nHost profile, thread {name}: {} samples ({:.0}% of the process's)\n", t.total, 100.0 * t.total as f64 / all as f64);
            println!("| self % | function | | inclusive % | function |");
            println!("|---|---|---|---|---|");
            let ranked = |m: &HashMap<String, isize>| {
                let mut v: Vec<_> = m.iter().map(|(k, &c)| (k.clone(), c)).collect();
                v.sort_by_key(|(k, c)| (-c, k.clone()));
                v.truncate(top);
                v
            };
            // What every sample of the thread ran under (its start, main, the bench's loop) says nothing.
            let under_some: HashMap<String, isize> = t.under.into_iter().filter(|&(_, c)| c < t.total).collect();
            let (own, under) = (ranked(&t.own), ranked(&under_some));
            for i in 0..own.len().max(under.len()) {
                let cell = |v: &[(String, isize)]| match v.get(i) {
                    Some((k, c)) => (format!("{:.1}", 100.0 * *c as f64 / t.total as f64), k.replace('|', "\\|")),
                    None => (String::new(), String::new()),
                };
                let ((op, of), (up, uf)) = (cell(&own), cell(&under));
                println!("| {op} | {of} | | {up} | {uf} |");
            }
        }
        Ok(())
    }
}

/// A demangled name without its argument list and template arguments,
/// cut to 120 characters: one row per function, readable in a table.
fn short(name: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in name.chars() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let out = if out.is_empty() { name.to_string() } else { out };
    // A Rust symbol's hash suffix (`::h0123456789abcdef`).
    let out = match out.rsplit_once("::h") {
        Some((path, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => path.to_string(),
        _ => out,
    };
    out.chars().take(120).collect()
}
