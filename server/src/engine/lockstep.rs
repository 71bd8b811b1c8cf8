//! One engine over the ranks of a distributed group: every rank runs the
//! same [`Engine`] turns on its part of the model (the model's collectives
//! meet inside each turn), and rank 0, which serves HTTP, decides what each
//! turn starts with. Before each turn rank 0 sends every rank a [`Turn`]:
//! the requests that arrived, the ones whose clients went away, and whether
//! to stop; each rank applies it to its engine the same way, so all engines
//! admit, batch, sample and cancel alike (a request's seed is fixed by rank 0,
//! a grammar travels as its source). Events of rank 0's engine go to the
//! clients; the other ranks drop theirs.
//!
//! A rank that dies breaks the group's next collective: every other rank
//! sees an error there, ends its requests and stops (rank 0 then answers 503
//! and exits). An idle rank 0 sends an empty turn every [`HEARTBEAT`], so a
//! lost rank is found within that time. A collective that fails on MLX's
//! worker threads in the middle of a turn leaves the collectives queued after
//! it blocked for ever (MLX's ring backend), and the engine thread with them:
//! a [`Watchdog`] then finds the error MLX stored, reports it the same way and
//! ends the process.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::{Array, Dtype};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

use super::core::Engine;
use super::handle::Command;
use super::request::{Event, Generation, Request};
use super::sampler::fresh_seed;
use super::stats::EngineStats;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::structured::Grammars;

/// How long an idle rank 0 waits before checking that the group still stands.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long a failing rank 0 waits for the answers to its requests (503) to go
/// out before it ends the process.
const ANSWERS_GO_OUT: Duration = Duration::from_millis(500);

/// How long a turn runs before the [`Watchdog`] looks for a failed collective.
const STALLED: Duration = Duration::from_secs(2);

/// Watches one rank's turns from its own thread: when a turn has run longer
/// than [`STALLED`] and MLX holds the error of a failed collective, the
/// engine thread is blocked behind it for good. The watchdog then hands the
/// reason to `on_failure` and ends the process (exit status 1).
#[derive(Clone)]
struct Watchdog {
    /// When the running turn began (ms after `epoch`, plus one); 0 between turns.
    turn_began: Arc<AtomicU64>,
    epoch: Instant,
}

impl Watchdog {
    fn start(group: &Group, on_failure: impl FnOnce(&str) + Send + 'static) -> Watchdog {
        let dog = Watchdog { turn_began: Arc::new(AtomicU64::new(0)), epoch: Instant::now() };
        let (watching, group) = (dog.clone(), group.clone());
        let spawned = std::thread::Builder::new().name("group-watchdog".into()).spawn(move || loop {
            std::thread::sleep(STALLED / 4);
            if watching.stalled() {
                if let Some(e) = group.take_error() {
                    let why = group_lost(&group, &e);
                    log::error!("{why}");
                    on_failure(&why);
                    mlx_rs_safe::distributed::exit_now(1);
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("no watchdog for the distributed group (a blocked rank may hang): {e}");
        }
        dog
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn turn_begins(&self) {
        self.turn_began.store(self.now(), Ordering::SeqCst);
    }

    fn turn_ends(&self) {
        self.turn_began.store(0, Ordering::SeqCst);
    }

    fn stalled(&self) -> bool {
        let began = self.turn_began.load(Ordering::SeqCst);
        began > 0 && self.now().saturating_sub(began) > STALLED.as_millis() as u64
    }
}

/// A request as it travels to the other ranks: its parameters, with its
/// grammar as Lark source (each rank compiles its own).
#[derive(Debug, Serialize, Deserialize)]
struct WireGeneration {
    params: Generation,
    guide: Option<String>,
}

/// What one turn starts with, decided by rank 0.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Turn {
    /// Requests that arrived, by the id rank 0 gave them.
    new: Vec<(u64, WireGeneration)>,
    /// Requests whose clients went away.
    cancelled: Vec<u64>,
    reset_peak_memory: bool,
    stop: bool,
}

impl Turn {
    fn is_empty(&self) -> bool {
        self.new.is_empty() && self.cancelled.is_empty() && !self.reset_peak_memory && !self.stop
    }
}

/// Sends rank 0's `bytes` to every rank (`None` on the others): the length,
/// then the bytes, each summed with the other ranks' zeros.
fn share(group: &Group, bytes: Option<&[u8]>) -> Result<Vec<u8>> {
    let len = bytes.map_or(0, <[u8]>::len);
    let len = i32::try_from(len).map_err(|_| Error::Engine(format!("a turn of {len} bytes is too large to send")))?;
    let total = group.all_sum(&Array::from_slice(&[len], &[1])?)?.item::<i32>()?;
    if total <= 0 {
        return Ok(Vec::new());
    }
    let mine = match bytes {
        Some(b) => Array::from_slice(b, &[total])?,
        None => mlx_rs_safe::ops::zeros(&[total], Dtype::Uint8)?,
    };
    Ok(group.all_sum(&mine)?.to_vec::<u8>()?)
}

/// Where each request's engine events go: the client's channel on rank 0,
/// nowhere on the other ranks. Keyed by request id, in id order.
#[derive(Default)]
struct Outbox {
    routes: BTreeMap<u64, Route>,
}

struct Route {
    /// What the engine sends this request.
    from_engine: UnboundedReceiver<Event>,
    to_client: Option<UnboundedSender<Event>>,
}

impl Outbox {
    /// A request for the engine whose events come here.
    fn open(&mut self, id: u64, params: Generation, to_client: Option<UnboundedSender<Event>>) -> Request {
        let (events, from_engine) = unbounded_channel();
        self.routes.insert(id, Route { from_engine, to_client });
        Request { params, arrived: Instant::now(), events }
    }

    /// Requests whose client went away (rank 0).
    fn abandoned(&self) -> Vec<u64> {
        self.routes.iter().filter(|(_, r)| r.to_client.as_ref().is_some_and(UnboundedSender::is_closed)).map(|(&id, _)| id).collect()
    }

    /// Closes the engine's channel of `id`: the engine stops the request as
    /// if its client had gone (the same turn on every rank).
    fn close(&mut self, id: u64) {
        self.routes.remove(&id);
    }

    /// Hands the events of this turn on; forgets finished requests.
    fn forward(&mut self) {
        self.routes.retain(|_, route| loop {
            match route.from_engine.try_recv() {
                Ok(event) => {
                    let last = matches!(event, Event::Done { .. } | Event::Error(_));
                    if let Some(client) = &route.to_client {
                        let _ = client.send(event);
                    }
                    if last {
                        break false;
                    }
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break true,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break false,
            }
        });
    }
}

/// Rank 0: turns the handle's commands into turns for every rank, and runs
/// them until a command stops them. When the group breaks down or a step
/// fails, the reason is published on `failed` before any request hears of it
/// (so the API answers them 503), every request ends with it, and the
/// process ends (see `fail`).
pub(super) fn lead(
    mut engine: Engine,
    stats: &EngineStats,
    metrics: &Metrics,
    rx: Receiver<Command>,
    group: &Group,
    failed: Arc<watch::Sender<Option<String>>>,
) {
    let publish = failed.clone();
    let watchdog = Watchdog::start(group, move |why| {
        publish.send_replace(Some(why.to_string()));
        std::thread::sleep(ANSWERS_GO_OUT);
    });
    let failed = failed.as_ref();
    let mut outbox = Outbox::default();
    let mut next_id = 0u64;
    stats.publish(engine.snapshot());
    loop {
        let mut turn = Turn::default();
        let mut requests = Vec::new();
        let mut take = |c: Command, turn: &mut Turn| match c {
            Command::Generate(r) => {
                let mut r = *r;
                // Every rank samples with the same seed.
                r.params.sampling.seed = Some(r.params.sampling.seed.unwrap_or_else(fresh_seed));
                turn.new.push((next_id, wire(&r.params)));
                requests.push((next_id, r));
                next_id += 1;
            }
            Command::ResetPeakMemory => turn.reset_peak_memory = true,
            Command::Shutdown => turn.stop = true,
        };
        if engine.is_idle() {
            match rx.recv_timeout(HEARTBEAT) {
                Ok(c) => take(c, &mut turn),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => turn.stop = true,
            }
        }
        while let Ok(c) = rx.try_recv() {
            take(c, &mut turn);
        }
        turn.cancelled = outbox.abandoned();
        watchdog.turn_begins();
        let bytes = match serde_json::to_vec(&turn) {
            Ok(b) => b,
            Err(e) => fail(engine, requests, failed, format!("cannot encode a turn: {e}")),
        };
        let sent: &[u8] = if turn.is_empty() { &[] } else { &bytes };
        if let Err(e) = share(group, Some(sent)) {
            fail(engine, requests, failed, group_lost(group, &e));
        }
        metrics.record_group_turn(sent.len() as u64);
        for (id, r) in requests {
            let request = outbox.open(id, r.params, Some(r.events));
            // Counted as waiting by the handle when it was submitted.
            engine.enqueue(request);
        }
        apply_common(&engine, &mut outbox, stats, &turn);
        if turn.stop {
            engine.abandon_all("the server is shutting down");
            outbox.forward();
            return;
        }
        engine.step();
        watchdog.turn_ends();
        // Before the step's events go out: its requests then hear of the
        // failure (503), not of the error the step ended them with.
        if let Some(e) = engine.take_step_failure() {
            fail(engine, Vec::new(), failed, step_failed(group, &e));
        }
        outbox.forward();
        stats.publish(engine.snapshot());
    }
}

/// Ranks other than 0: run the turns rank 0 sends until it says stop. When
/// the group breaks down (or a step fails here), reports why and ends the
/// process (exit status 1), as rank 0 does.
pub fn follow(mut engine: Engine, group: &Group, grammars: &Grammars) {
    let watchdog = Watchdog::start(group, |_| {});
    if let Err(e) = run_turns(&mut engine, group, grammars, &watchdog) {
        log::error!("{e}");
        mlx_rs_safe::distributed::exit_now(1);
    }
}

fn run_turns(engine: &mut Engine, group: &Group, grammars: &Grammars, watchdog: &Watchdog) -> Result<()> {
    let mut outbox = Outbox::default();
    let stats = EngineStats::default();
    loop {
        // Waiting for rank 0's turn counts: rank 0 sends one at least every HEARTBEAT.
        watchdog.turn_begins();
        let bytes = share(group, None).map_err(|e| Error::Engine(group_lost(group, &e)))?;
        let turn: Turn = if bytes.is_empty() {
            Turn::default()
        } else {
            serde_json::from_slice(&bytes).map_err(|e| Error::Engine(format!("rank 0 sent a turn this rank cannot read: {e}")))?
        };
        for (id, g) in turn.new.iter() {
            let params = unwire(g, grammars)?;
            let request = outbox.open(*id, params, None);
            engine.submit(request);
        }
        apply_common(engine, &mut outbox, &stats, &turn);
        if turn.stop {
            engine.abandon_all("the server is shutting down");
            return Ok(());
        }
        engine.step();
        watchdog.turn_ends();
        outbox.forward();
        if let Some(e) = engine.take_step_failure() {
            return Err(Error::Engine(step_failed(group, &e)));
        }
    }
}

/// What every rank does with a turn besides admitting its requests.
fn apply_common(engine: &Engine, outbox: &mut Outbox, stats: &EngineStats, turn: &Turn) {
    for id in &turn.cancelled {
        outbox.close(*id);
    }
    if turn.reset_peak_memory {
        super::handle::reset_peak_memory(engine, stats);
    }
}

fn group_lost(group: &Group, e: &impl std::fmt::Display) -> String {
    format!("the distributed group of {} ranks broke down (a rank stopped or its connection was lost): {e}", group.size())
}

/// Publishes `why` on `failed`, then ends every request with it: those the
/// engine holds and `arrived`, which it never saw; then, once their answers
/// (503) have gone out, ends the process (exit status 1). Not by returning:
/// MLX's stream threads may be blocked in collectives queued behind the
/// failed one, and its exit-time destructors would wait for them.
fn fail(mut engine: Engine, arrived: Vec<(u64, Request)>, failed: &watch::Sender<Option<String>>, why: String) -> ! {
    log::error!("{why}");
    failed.send_replace(Some(why.clone()));
    engine.abandon_all(&why);
    for (_, r) in arrived {
        let _ = r.events.send(Event::Error(why.clone()));
    }
    std::thread::sleep(ANSWERS_GO_OUT);
    mlx_rs_safe::distributed::exit_now(1);
}

fn step_failed(group: &Group, e: &str) -> String {
    format!("a step failed on rank {} of the distributed group, which cannot go on out of step: {e}", group.rank())
}

fn wire(g: &Generation) -> WireGeneration {
    WireGeneration { params: g.clone(), guide: g.guide.as_ref().map(|guide| guide.source().to_string()) }
}

fn unwire(g: &WireGeneration, grammars: &Grammars) -> Result<Generation> {
    let guide = match &g.guide {
        Some(source) => Some(grammars.compile_source(source).map_err(|e| Error::Engine(format!("a grammar rank 0 compiled does not compile here: {e}")))?),
        None => None,
    };
    Ok(Generation { guide, ..g.params.clone() })
}
