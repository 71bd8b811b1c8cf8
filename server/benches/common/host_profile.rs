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

/// Samples by function: where a sample was (self), and each function on its
/// stack (inclusive, counted once a sample).
#[derive(Default)]
struct Tally {
    total: isize,
    own: HashMap<String, isize>,
    under: HashMap<String, isize>,
}

impl Tally {
    /// Adds a sample of `count` with these function names, innermost first.
    fn add(&mut self, names: &[String], count: isize) {
        self.total += count;
        if let Some(first) = names.first() {
            *self.own.entry(first.clone()).or_default() += count;
        }
        for name in names.iter().collect::<HashSet<_>>() {
            *self.under.entry(name.clone()).or_default() += count;
        }
    }

    /// Prints the `top` functions by self and by inclusive samples, as a
    /// Markdown table of percentages of this tally's samples.
    fn print(&self, top: usize) {
        println!("| self % | function | | inclusive % | function |");
        println!("|---|---|---|---|---|");
        let ranked = |m: &HashMap<String, isize>| {
            let mut v: Vec<_> = m.iter().map(|(k, &c)| (k.clone(), c)).collect();
            v.sort_by_key(|(k, c)| (-c, k.clone()));
            v.truncate(top);
            v
        };
        // What every sample ran under (the thread's start, main, the focus itself) says nothing.
        let under_some: HashMap<String, isize> = self.under.iter().filter(|&(_, &c)| c < self.total).map(|(k, &c)| (k.clone(), c)).collect();
        let (own, under) = (ranked(&self.own), ranked(&under_some));
        for i in 0..own.len().max(under.len()) {
            let cell = |v: &[(String, isize)]| match v.get(i) {
                Some((k, c)) => (format!("{:.1}", 100.0 * *c as f64 / self.total as f64), k.replace('|', "\\|")),
                None => (String::new(), String::new()),
            };
            let ((op, of), (up, uf)) = (cell(&own), cell(&under));
            println!("| {op} | {of} | | {up} | {uf} |");
        }
    }
}

impl HostProfile {
    pub fn start(hz: i32) -> Res<HostProfile> {
        // Unwinding from inside libc's and the dynamic loader's own frames is
        // what pprof's authors found to crash; their samples are dropped.
        let guard = pprof::ProfilerGuardBuilder::default().frequency(hz).blocklist(&["libc", "libgcc", "pthread", "vdso", "ld-linux"]).build()?;
        Ok(HostProfile(guard))
    }

    /// Prints, for each thread with at least 5% of the samples, its `top`
    /// functions by self and by inclusive samples, then the same within each
    /// of `focus` (the samples with that function on their stack: e.g. the
    /// bench's graph building and MLX's launch), as Markdown.
    pub fn print(self, top: usize, focus: &[&str]) -> Res<()> {
        let report = self.0.report().build()?;
        // Per thread: all its samples, then those under each focus function.
        let mut threads: HashMap<String, (Tally, Vec<Tally>)> = HashMap::new();
        for (frames, &count) in &report.data {
            // Threads inherit the process's name: its id tells them apart.
            let (all, within) = threads
                .entry(format!("{} (id {})", frames.thread_name, frames.thread_id))
                .or_insert_with(|| (Tally::default(), focus.iter().map(|_| Tally::default()).collect()));
            // Innermost frame first; an inlined function before the one it is inlined in.
            let names: Vec<String> = frames.frames.iter().flatten().map(|s| short(&s.name())).collect();
            all.add(&names, count);
            for (f, tally) in focus.iter().zip(within.iter_mut()) {
                if let Some(at) = names.iter().position(|n| n == f) {
                    tally.add(&names[..at], count);
                }
            }
        }
        let process: isize = threads.values().map(|(t, _)| t.total).sum();
        let mut order: Vec<_> = threads.into_iter().filter(|(_, (t, _))| t.total * 20 >= process).collect();
        order.sort_by_key(|(_, (t, _))| -t.total);
        for (name, (all, within)) in order {
            println!("\nHost profile, thread {name}: {} samples ({:.0}% of the process's)\n", all.total, 100.0 * all.total as f64 / process as f64);
            all.print(top);
            for (f, tally) in focus.iter().zip(&within) {
                if tally.total > 0 {
                    println!("\nWithin `{f}`: {} samples ({:.0}% of the thread's)\n", tally.total, 100.0 * tally.total as f64 / all.total as f64);
                    tally.print(top);
                }
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
