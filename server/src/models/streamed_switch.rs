//! The MoE switch layer with its routed experts streamed from disk
//! (`--stream-experts`): a fixed pool of expert slots per layer, filled on
//! demand by the expert readers, and the same `gather_qmm` / `gather_mm` as the
//! resident layer over the pool, with router ids remapped to slot ids. The
//! slots hold the file's bytes, so the output is the resident layer's, bit for
//! bit.
//!
//! A step reads its router's ids back to the host (the one sync a streamed
//! layer makes), reads each expert it lacks once, and writes them into free or
//! evicted slots with a scatter. A speculative decode step
//! (`experts::speculation`) does not: it routes through the layer's expert →
//! slot map on the device and records its choice, checked at the step's end.
//! The pools are MLX arrays, updated functionally: a graph still queued on the
//! old pool keeps reading the old bytes (MLX copies instead of updating in
//! place while anything references it), so no slot is overwritten under
//! queued work. Once a layer holds every expert it stops syncing: ids map to
//! slots on the device. A budget that holds every expert fills the pools at
//! load, so such layers never sync.
//!
//! A step does not always wait for the next layer's router: that router runs
//! on this layer's input (the residual stream changes little from one layer
//! to the next), read back in the same sync as this layer's own ids, and the
//! experts it picks that the next layer lacks are read while this layer
//! computes. A wide step (a prefill chunk whose tokens pick every expert
//! several times over) reads all of them once its own reads are in. The
//! guess replaced reading what the next layer's previous wide chunk used:
//! it covers a prompt's first chunk too, and on the H200 78% of a prefill's
//! misses were read ahead (49% before; 95% of what was read ahead was used),
//! for 1.28x the prefill speed (BENCHMARKS.md). A narrow step (decoding)
//! reads up to `--expert-prefetch N` of them (8 by default). The reads
//! wait outside the pool; the next layer takes those its router chose and
//! drops the rest, so a wrong guess costs its read and evicts nothing. A
//! layer whose decode-step guesses are mostly wrong stops taking them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use mlx_rs_safe::{fast, ops, Array, Dtype};

use super::layers::Linear;
use super::moe::MoeSpec;
use super::quant::{scales_stored, QuantConfig};
use super::switch::{GluActivation, StackLayout, SwitchGlu};
use super::weights::{Stored, Weights};
use crate::error::{Error, Result};
use crate::experts::slots::{Plan, SlotTable};
use crate::experts::{ExpertStream, PendingReads, ReadJob, Region, StreamedLayer};

/// One stacked tensor of the layer (e.g. `up_proj.scales`), per expert.
struct ExpertTensor {
    name: String,
    dtype: Dtype,
    /// One expert's shape.
    shape: Vec<i32>,
    regions: Vec<Region>,
}

struct State {
    table: SlotTable,
    /// Per tensor: [slots, ...shape].
    pools: Vec<Array>,
    /// Every expert is in the pool: steps route on the device, no lookups.
    complete: bool,
    /// Expert → slot on the device (slot 0 for experts not in the pool, see
    /// `SlotTable::device_map`); None when the table changed since it was made.
    map: Option<Array>,
    /// Reads begun before the layer's router ran, by the layer before.
    ahead: Option<Ahead>,
    /// Reads for a speculative step's next pass, and the plan they install.
    replay: Option<(Plan, MissReads)>,
    /// Experts installed for a speculative step's next pass, not yet used or
    /// passed over by it: counted as misses when used.
    replay_installed: Vec<u32>,
    guesses: GuessRecord,
    /// How the layer before guesses this layer's experts (set after load).
    guesser: Option<Guesser>,
}

/// Reads of experts begun before the layer's router ran.
struct Ahead {
    experts: Vec<u32>,
    reads: PendingReads,
    /// Guessed by the layer before in a narrow step (else read ahead in a wide one).
    guessed: bool,
}

/// How a layer guesses its experts from an earlier layer's MoE input: its own
/// router's projection, after the router's own norm where the family has
/// one (Gemma 4), and the k largest logits (every router we load keeps
/// those, whatever it computes from them after).
pub struct Guesser {
    /// A copy of the router's projection (its arrays shared, not duplicated).
    pub proj: Linear,
    /// rms_norm weight and epsilon applied before the projection.
    pub norm: Option<(Array, f32)>,
    pub top_k: i32,
}

/// Guessed experts read for a layer, and how many it used.
#[derive(Default)]
struct GuessRecord {
    issued: u64,
    used: u64,
    stopped: bool,
}

/// Guessed experts a layer is judged on before it may stop guessing.
const GUESS_TRIAL: u64 = 64;
/// A layer stops taking guesses once fewer than this share were used.
const GUESS_MIN_USED: f64 = 0.25;

impl GuessRecord {
    fn record_use(&mut self, layer: u32, used: usize) {
        self.used += used as u64;
        if !self.stopped && self.issued >= GUESS_TRIAL && (self.used as f64) < GUESS_MIN_USED * self.issued as f64 {
            self.stopped = true;
            log::info!("layer {layer}: expert prefetch stopped, {} of {} guessed experts were used", self.used, self.issued);
        }
    }
}

/// A step whose tokens pick at least this many times the layer's experts is
/// wide: it will likely use nearly all of them (under even routing it misses
/// e^-2 ≈ 14% at 2x), so the next layer's reads start before its router runs.
const WIDE_PICKS_PER_EXPERT: usize = 2;

pub struct StreamedSwitchGlu {
    layer: u32,
    tensors: Vec<ExpertTensor>,
    layouts: [StackLayout; 3],
    activation: GluActivation,
    expert_bytes: u64,
    stream: Arc<ExpertStream>,
    state: Mutex<State>,
}

const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

impl StreamedSwitchGlu {
    /// Indexes the routed experts of the MoE block at `prefix` (layer `layer`):
    /// stacked `{prefix}.switch_mlp.*` or per-expert `{prefix}.experts.{e}.*`
    /// tensors, never read here; allocates the layer's slot pool.
    pub fn load(w: &mut Weights, prefix: &str, layer: u32, spec: &MoeSpec, dim: i32, quant: &QuantConfig, stream: Arc<ExpertStream>) -> Result<Arc<StreamedSwitchGlu>> {
        let (e, hidden) = (spec.num_experts, spec.expert_hidden);
        let mut tensors = Vec::new();
        let mut layouts = [StackLayout { quant: None, bias: spec.parts.expert_bias }; 3];
        for (p, ours) in PROJECTIONS.iter().enumerate() {
            let hf = spec.hf_expert_names.iter().find(|(_, o)| o == ours).map_or(*ours, |(h, _)| *h);
            let stacked = format!("{prefix}.{}.{ours}", spec.parts.switch);
            let single = |x: i32| format!("{prefix}.experts.{x}.{hf}");
            let (rows, cols) = if p < 2 { (hidden, dim) } else { (dim, hidden) };
            let quantized = w.contains(&format!("{stacked}.scales")) || w.contains(&format!("{}.scales", single(0)));
            let mut parts: Vec<(&str, Vec<i32>, Stored)> = if quantized {
                let q = quant.for_layer(&stacked)?;
                layouts[p].quant = Some(q);
                let groups = vec![rows, cols / q.group_size];
                let mut parts = vec![("weight", vec![rows, cols * q.bits / 32], Stored::Packed), ("scales", groups.clone(), scales_stored(q))];
                if q.mode.has_biases() {
                    parts.push(("biases", groups, Stored::FloatUnread));
                }
                parts
            } else {
                vec![("weight", vec![rows, cols], Stored::FloatUnread)]
            };
            if spec.parts.expert_bias {
                parts.push(("bias", vec![rows], Stored::FloatUnread));
            }
            for (part, shape, stored) in parts {
                let name = format!("{stacked}.{part}");
                let (dtype, regions) = if w.contains(&name) {
                    let full: Vec<i32> = std::iter::once(e).chain(shape.iter().copied()).collect();
                    let src = w.take_source(&name, &full, stored)?;
                    let slab = src.meta.nbytes / e as u64;
                    let regions = (0..e as u64).map(|x| Region { file: src.file.clone(), offset: src.meta.offset + x * slab, len: slab as usize }).collect();
                    (src.meta.dtype, regions)
                } else {
                    let mut dtype = None;
                    let mut regions = Vec::with_capacity(e as usize);
                    for x in 0..e {
                        let src = w.take_source(&format!("{}.{part}", single(x)), &shape, stored)?;
                        if dtype.get_or_insert(src.meta.dtype) != &src.meta.dtype {
                            return Err(Error::model_file(&src.file, format!("expert {x} of {name} is {:?}, expert 0 is {dtype:?}", src.meta.dtype)));
                        }
                        regions.push(Region { file: src.file.clone(), offset: src.meta.offset, len: src.meta.nbytes as usize });
                    }
                    (dtype.unwrap_or(Dtype::Float32), regions)
                };
                tensors.push(ExpertTensor { name, dtype, shape: shape.clone(), regions });
            }
        }
        let slots = stream.slots(e as usize, spec.top_k as usize)?;
        let pools = tensors
            .iter()
            .map(|t| {
                let shape: Vec<i32> = std::iter::once(slots as i32).chain(t.shape.iter().copied()).collect();
                ops::zeros(&shape, t.dtype)
            })
            .collect::<mlx_rs_safe::Result<Vec<_>>>()?;
        // Allocated now: the budget is a hard cap, not something reached later.
        mlx_rs_safe::eval(&pools.iter().collect::<Vec<_>>())?;
        let expert_bytes: u64 = tensors.iter().map(|t| t.regions[0].len as u64).sum();
        stream.reader.counters().add_capacity((slots as u64 * expert_bytes) as i64);
        let layer = StreamedSwitchGlu {
            layer,
            tensors,
            layouts,
            activation: spec.parts.activation,
            expert_bytes,
            stream,
            state: Mutex::new(State {
                table: SlotTable::new(e as usize, slots),
                pools,
                complete: false,
                map: None,
                ahead: None,
                replay: None,
                replay_installed: Vec::new(),
                guesses: GuessRecord::default(),
                guesser: None,
            }),
        };
        if slots == e as usize {
            layer.preload()?;
        }
        let layer = Arc::new(layer);
        let weak: Weak<dyn StreamedLayer> = Arc::downgrade(&layer) as Weak<dyn StreamedLayer>;
        layer.stream.register(layer.layer, weak);
        Ok(layer)
    }

    /// Gives the layer its router, with which earlier layers guess its experts
    /// (`--expert-prefetch`); the first one given stays.
    pub fn guess_with(&self, guesser: Guesser) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).guesser.get_or_insert(guesser);
    }

    /// Reads every expert into the pool now: with a budget that holds them
    /// all, the layer never has to read back its router's choice (which costs
    /// more than the reads it saves), so it takes the resident path from the
    /// first step. The reads are counted as misses, like any other.
    fn preload(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let all: Vec<u32> = (0..self.tensors[0].regions.len() as u32).collect();
        let plan = st.table.plan(&all);
        self.stream.reader.counters().record_lookup(self.layer, 0, plan.misses.len() as u64);
        let read = self.read(&plan.misses)?;
        // Every slot is installed, so the pools are the reads in slot order:
        // made from them directly, with the empty pools let go first (a
        // scatter into them would hold the empty pool, the reads, their
        // concatenation and the result at once: 4x the layer's experts at
        // load, MLX's peak on the GPU at 100%).
        let mut by_slot = plan.installs.clone();
        by_slot.sort_unstable_by_key(|&(_, slot)| slot);
        if by_slot.len() != st.table.slots() {
            return Err(Error::Internal("a preload that does not fill every slot"));
        }
        st.pools.clear();
        let n = self.tensors.len();
        let pools = (0..n)
            .map(|t| Ok(ops::concatenate(&by_slot.iter().map(|&(i, _)| &read[i * n + t]).collect::<Vec<_>>(), 0)?))
            .collect::<Result<Vec<_>>>()?;
        drop(read);
        // One layer at a time: the reads are freed before the next layer's.
        mlx_rs_safe::eval(&pools.iter().collect::<Vec<_>>())?;
        st.commit(&plan, pools, self.expert_bytes, &self.stream);
        Ok(())
    }

    /// x [B, L, D], indices [B, L, k] → [B, L, k, D], as `SwitchGlu::forward`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let speculating = !st.complete && self.stream.speculating();
        if st.complete || speculating {
            if speculating {
                self.stream.record_choice(self.layer, indices)?;
            }
            let slots = ops::take(st.device_map()?, indices, 0)?;
            return SwitchGlu::from_stacks(&st.pools, &self.layouts, self.activation)?.forward(x, &slots);
        }
        let entered = std::time::Instant::now();
        let counters = self.stream.reader.counters();
        let experts = self.tensors[0].regions.len();
        let wide = indices.size() >= WIDE_PICKS_PER_EXPERT * experts;
        // The next streamed layer's router runs on this layer's input (the
        // residual stream changes little from one layer to the next), read
        // back with this layer's own ids: a wide step reads ahead what it
        // picks, a narrow one guesses from it (`--expert-prefetch`).
        let predicts = if wide { self.stream.reads_ahead() } else { self.stream.prefetch > 0 };
        let next = if predicts { self.stream.next_layer(self.layer) } else { None };
        let guess = match &next {
            Some(next) => next.predict(x, wide)?,
            None => None,
        };
        counters.record_host_sync();
        let own = ops::reshape(&ops::astype(indices, Dtype::Uint32)?, &[-1])?;
        let waiting = std::time::Instant::now();
        let read_back = match &guess {
            Some(guess) => ops::concatenate(&[&own, guess], 0)?.to_vec::<u32>()?,
            None => own.to_vec::<u32>()?,
        };
        let router_wait = waiting.elapsed();
        counters.record_router_wait(router_wait.as_secs_f64());
        let (ids, guessed) = read_back.split_at(indices.size());
        self.check_choice(ids)?;
        let plan = st.table.plan(ids);
        st.record_lookup(&plan, self.layer, &self.stream);
        // A failed read leaves table and pools as they were.
        let ahead = st.ahead.take();
        let was_guessed = ahead.as_ref().is_some_and(|a| a.guessed);
        let (reads, used_ahead) = self.submit_misses(&plan.misses, ahead)?;
        if was_guessed {
            st.guesses.record_use(self.layer, used_ahead);
        }
        let read = reads.wait()?;
        let read_wait = waiting.elapsed() - router_wait;
        // Only once this layer's reads succeeded: a failed step leaves no
        // reads running for a step that will not come.
        if let (Some(next), Some(_)) = (&next, &guess) {
            next.read_ahead(guessed, wide)?;
        }
        let (stacks, index) = if plan.fits {
            let pools = self.install(&st.pools, &plan, &read)?;
            st.commit(&plan, pools, self.expert_bytes, &self.stream);
            let slots = ids.iter().map(|&e| st.table.slot(e)).collect::<Option<Vec<u32>>>();
            (st.pools.clone(), slots.ok_or(Error::Internal("a step that fits the pool used an expert not in it"))?)
        } else {
            let (stacks, position) = self.stage_and_install(st, &plan, read)?;
            (stacks, ids.iter().map(|&e| position[e as usize]).collect::<Vec<u32>>())
        };
        let index = Array::from_slice(&index, &indices.shape())?;
        let out = SwitchGlu::from_stacks(&stacks, &self.layouts, self.activation)?.forward(x, &index);
        // A timeline of the step's streamed layers (`bench/expert_timeline.py`
        // groups it into passes): where the time between layers goes.
        log::trace!(
            "expert step: layer {} {} at {:.1} ms, {} misses, router wait {:.1} ms, read wait {:.1} ms, done at {:.1} ms",
            self.layer,
            if wide { "wide" } else { "narrow" },
            self.stream.millis_since_start(entered),
            plan.misses.len(),
            router_wait.as_secs_f64() * 1e3,
            read_wait.as_secs_f64() * 1e3,
            self.stream.millis_since_start(std::time::Instant::now()),
        );
        out
    }

    /// A router's choice read back: every id names one of the layer's experts.
    fn check_choice(&self, ids: &[u32]) -> Result<()> {
        let experts = self.tensors[0].regions.len();
        match ids.iter().find(|&&e| e as usize >= experts) {
            Some(bad) => Err(Error::Engine(format!("layer {}: the router chose expert {bad} of {experts}", self.layer))),
            None => Ok(()),
        }
    }

    /// Reads every tensor of each expert in `misses`, all at once: the arrays
    /// [1, ...shape], expert-major (`misses[i]`'s tensor t at i * tensors + t).
    fn read(&self, misses: &[u32]) -> Result<Vec<Array>> {
        self.stream.reader.read_all(self.jobs(misses))
    }

    fn jobs(&self, experts: &[u32]) -> Vec<ReadJob> {
        experts
            .iter()
            .flat_map(|&e| {
                self.tensors.iter().map(move |t| ReadJob {
                    region: t.regions[e as usize].clone(),
                    shape: std::iter::once(1).chain(t.shape.iter().copied()).collect(),
                    dtype: t.dtype,
                    what: format!("{}, expert {e}", t.name),
                })
            })
            .collect()
    }

    /// Starts the reads of `misses` that `ahead` (reads begun before the
    /// router ran) does not cover; collecting the result waits for both.
    /// Also returns how many misses the reads ahead cover.
    fn submit_misses(&self, misses: &[u32], ahead: Option<Ahead>) -> Result<(MissReads, usize)> {
        let (reads, started) = self.start_reads(misses, ahead)?;
        let used = misses.len() - started;
        self.stream.reader.counters().record_prefetch_used(used as u64);
        Ok((reads, used))
    }

    /// Starts the reads of `misses` that `ahead` does not cover; returns the
    /// reads (collecting them waits for both) and how many it started.
    fn start_reads(&self, misses: &[u32], ahead: Option<Ahead>) -> Result<(MissReads, usize)> {
        let begun = ahead.as_ref().map_or(&[][..], |a| a.experts.as_slice());
        let rest: Vec<u32> = misses.iter().copied().filter(|e| !begun.contains(e)).collect();
        let reads = MissReads { rest: self.stream.reader.submit(self.jobs(&rest))?, ahead, misses: misses.to_vec(), tensors: self.tensors.len() };
        Ok((reads, rest.len()))
    }

    /// The pools with the plan's installs written into their slots, from the reads.
    fn install(&self, pools: &[Array], plan: &Plan, read: &[Array]) -> Result<Vec<Array>> {
        let n = self.tensors.len();
        write_slots(pools, plan, |t| {
            let parts: Vec<&Array> = plan.installs.iter().map(|&(i, _)| &read[i * n + t]).collect();
            Ok(ops::concatenate(&parts, 0)?)
        })
    }

    /// A step that uses more experts than the pool holds computes on a
    /// one-step staging set of every expert it uses (the pool's hits, then
    /// the misses, those going into the pool first), returned with each
    /// expert's place in it; the installs are written into the pool from it.
    fn stage_and_install(&self, st: &mut State, plan: &Plan, read: Vec<Array>) -> Result<(Vec<Array>, Vec<u32>)> {
        let hits: Vec<u32> = plan.used.iter().copied().filter(|&e| st.table.slot(e).is_some()).collect();
        let hit_slots: Vec<u32> = hits.iter().filter_map(|&e| st.table.slot(e)).collect();
        let mut installed = vec![false; plan.misses.len()];
        for &(i, _) in &plan.installs {
            installed[i] = true;
        }
        let miss_order: Vec<usize> = plan.installs.iter().map(|&(i, _)| i).chain((0..plan.misses.len()).filter(|&i| !installed[i])).collect();
        let mut position = vec![u32::MAX; self.tensors[0].regions.len()];
        for (p, &e) in hits.iter().chain(miss_order.iter().map(|&i| &plan.misses[i])).enumerate() {
            position[e as usize] = p as u32;
        }
        let hit_slots = Array::from_vec(&hit_slots)?;
        let n = self.tensors.len();
        let stacks = st
            .pools
            .iter()
            .enumerate()
            .map(|(t, pool)| {
                let mut parts = Vec::with_capacity(plan.used.len());
                if !hits.is_empty() {
                    parts.push(ops::take(pool, &hit_slots, 0)?);
                }
                parts.extend(miss_order.iter().map(|&i| read[i * n + t].clone()));
                Ok(ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?)
            })
            .collect::<Result<Vec<_>>>()?;
        if plan.installs.is_empty() {
            st.commit(plan, st.pools.clone(), self.expert_bytes, &self.stream);
            return Ok((stacks, position));
        }
        // The staging set is made first, and the pools' update reads its
        // rows instead of the reads: MLX writes a scatter into its input's
        // buffer only when nothing else holds it, and the set's gather from
        // the old pool would hold that until the step's end (a copy of the
        // layer's pool), as would a second copy of the reads for the update.
        // The stream is drained too: its backend lets go of a kernel's inputs
        // after the kernel's output is ready (CUDA: in a completion handler).
        mlx_rs_safe::eval(&stacks.iter().collect::<Vec<_>>())?;
        mlx_rs_safe::synchronize()?;
        drop(read);
        let (from, to) = (hits.len() as i32, (hits.len() + plan.installs.len()) as i32);
        let pools = write_slots(&st.pools, plan, |t| Ok(ops::slice_axis(&stacks[t], 0, from, to)?))?;
        // The old pools are held by nothing but their scatters from here on.
        st.pools.clear();
        // Computed now, not with the layer's next step: every layer would
        // otherwise hold its old pool and the installs until then (a second
        // copy of the cache: at 50% MLX's peak rose above holding every
        // expert). The pools are the scatters' from here on, failed or not.
        let launched = mlx_rs_safe::async_eval(&pools.iter().collect::<Vec<_>>());
        st.commit(plan, pools, self.expert_bytes, &self.stream);
        launched?;
        Ok((stacks, position))
    }
}

/// `pools` with `plan`'s installs written into their slots: tensor t's rows
/// from `rows(t)` ([installs, ...shape], in the installs' order).
fn write_slots(pools: &[Array], plan: &Plan, rows: impl Fn(usize) -> Result<Array>) -> Result<Vec<Array>> {
    if plan.installs.is_empty() {
        return Ok(pools.to_vec());
    }
    let slots = Array::from_vec(&plan.installs.iter().map(|&(_, s)| s).collect::<Vec<u32>>())?;
    pools
        .iter()
        .enumerate()
        .map(|(t, pool)| {
            // [installs, 1, ...shape]: one pool row per index.
            let updates = ops::expand_dims(&rows(t)?, &[1])?;
            Ok(ops::scatter(pool, &[&slots], &updates, &[0])?)
        })
        .collect()
}

impl State {
    /// The expert → slot map on the device, made again after the table changed.
    fn device_map(&mut self) -> Result<&Array> {
        if self.map.is_none() {
            self.map = Some(Array::from_vec(&self.table.device_map())?);
        }
        self.map.as_ref().ok_or(Error::Internal("an expert map just made is missing"))
    }

    /// Records a step's lookups: its hits and misses, experts installed for
    /// this step's replay (`replay_installed`) counted as misses (they were
    /// not in the slots when the step began) and as read ahead and used.
    fn record_lookup(&mut self, plan: &Plan, layer: u32, stream: &ExpertStream) {
        let installed = std::mem::take(&mut self.replay_installed);
        let early = plan.used.iter().filter(|e| installed.contains(e) && !plan.misses.contains(e)).count();
        let counters = stream.reader.counters();
        counters.record_lookup(layer, (plan.hits() - early) as u64, (plan.misses.len() + early) as u64);
        counters.record_prefetch_used(early as u64);
    }

    /// Records that `plan` ran, its installs written into `pools`.
    fn commit(&mut self, plan: &Plan, pools: Vec<Array>, expert_bytes: u64, stream: &ExpertStream) {
        let filled = self.table.commit(plan);
        self.pools = pools;
        stream.reader.counters().add_resident((filled as u64 * expert_bytes) as i64);
        if !plan.installs.is_empty() {
            self.map = None;
            self.complete = self.table.is_complete();
        }
    }
}

impl StreamedLayer for StreamedSwitchGlu {
    fn read_ahead(&self, predicted: &[u32], wide: bool) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.ahead.is_some() || st.complete || (st.guesses.stopped && !wide) {
            return Ok(());
        }
        let experts = self.tensors[0].regions.len();
        let mut picks = vec![0usize; experts];
        for &e in predicted.iter().filter(|&&e| (e as usize) < experts) {
            picks[e as usize] += 1;
        }
        let mut lacking: Vec<u32> = (0..experts as u32).filter(|&e| picks[e as usize] > 0 && st.table.slot(e).is_none()).collect();
        // The most picked first (a stable sort: ties by id).
        lacking.sort_by_key(|&e| std::cmp::Reverse(picks[e as usize]));
        if !wide {
            lacking.truncate(self.stream.prefetch);
        }
        if lacking.is_empty() {
            return Ok(());
        }
        let reads = self.stream.reader.submit(self.jobs(&lacking))?;
        self.stream.reader.counters().record_prefetch_issued(lacking.len() as u64);
        // Only a narrow step's guesses are judged (see `GuessRecord`).
        if !wide {
            st.guesses.issued += lacking.len() as u64;
        }
        st.ahead = Some(Ahead { experts: lacking, reads, guessed: !wide });
        Ok(())
    }

    fn predict(&self, x: &Array, wide: bool) -> Result<Option<Array>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(g) = &st.guesser else { return Ok(None) };
        if st.complete || st.ahead.is_some() || (st.guesses.stopped && !wide) {
            return Ok(None);
        }
        let h = match &g.norm {
            Some((weight, eps)) => fast::rms_norm(x, Some(weight), *eps)?,
            None => x.clone(),
        };
        let logits = g.proj.forward(&h)?;
        let e = logits.dim(-1)?;
        let k = g.top_k.min(e);
        let top = ops::argpartition(&logits, -k, -1)?;
        let top = ops::slice_axis(&top, -1, e - k, e)?;
        Ok(Some(ops::reshape(&ops::astype(&top, Dtype::Uint32)?, &[-1])?))
    }

    fn confirm(&self, ids: &[u32]) -> Result<bool> {
        self.check_choice(ids)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let plan = st.table.plan(ids);
        if !plan.misses.is_empty() {
            return Ok(false);
        }
        st.record_lookup(&plan, self.layer, &self.stream);
        st.table.commit(&plan);
        Ok(true)
    }

    fn read_for_replay(&self, ids: &[u32], cap: usize) -> Result<Option<usize>> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        if st.replay.is_some() || st.complete {
            return Ok(Some(0));
        }
        let experts = self.tensors[0].regions.len();
        let valid: Vec<u32> = ids.iter().copied().filter(|&e| (e as usize) < experts).collect();
        let plan = st.table.plan(&valid);
        if !plan.fits {
            // More experts than slots: only the per-layer path (staging) runs it.
            return Ok(None);
        }
        let n = plan.misses.len();
        if n == 0 || n > cap {
            return Ok(Some(0));
        }
        // Reads begun ahead of the router (a prefill's read-ahead, a guess)
        // are taken over: what they cover is not read again.
        let ahead = st.ahead.take();
        let was_guessed = ahead.as_ref().is_some_and(|a| a.guessed);
        let (reads, started) = self.start_reads(&plan.misses, ahead)?;
        if was_guessed {
            st.guesses.record_use(self.layer, n - started);
        }
        self.stream.reader.counters().record_prefetch_issued(started as u64);
        st.replay = Some((plan, reads));
        Ok(Some(started))
    }

    fn abandon_replay(&self) {
        let replay = self.state.lock().unwrap_or_else(|e| e.into_inner()).replay.take();
        if let Some((_, reads)) = replay {
            // Its reads are left to finish (their bytes stay counted); the
            // step failed with another error already.
            let _ = reads.wait();
        }
    }

    fn install_for_replay(&self) -> Result<()> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let Some((plan, reads)) = st.replay.take() else { return Ok(()) };
        let read = reads.wait()?;
        let pools = self.install(&st.pools, &plan, &read)?;
        // Installed, not used: the pass that uses them touches them.
        let installs_only = Plan { used: Vec::new(), ..plan };
        st.replay_installed.extend(installs_only.installs.iter().map(|&(i, _)| installs_only.misses[i]));
        st.commit(&installs_only, pools, self.expert_bytes, &self.stream);
        Ok(())
    }

    fn expert_bytes(&self) -> u64 {
        self.expert_bytes
    }
}

/// The reads of one step's misses: some begun ahead, the rest just queued.
struct MissReads {
    rest: PendingReads,
    ahead: Option<Ahead>,
    misses: Vec<u32>,
    tensors: usize,
}

impl MissReads {
    /// Every miss's arrays, laid out as [`StreamedSwitchGlu::read`] gives them.
    fn wait(self) -> Result<Vec<Array>> {
        let rest = self.rest.wait()?;
        let Some(Ahead { experts: ahead_experts, reads: ahead_reads, .. }) = self.ahead else { return Ok(rest) };
        let n = self.tensors;
        // Read ahead but not used: freed here (the bytes stay counted).
        let mut ahead = ahead_reads.wait()?.into_iter();
        let mut ahead_by_expert: HashMap<u32, Vec<Array>> = ahead_experts.into_iter().map(|e| (e, ahead.by_ref().take(n).collect())).collect();
        let mut from_rest = rest.into_iter();
        let mut out = Vec::with_capacity(self.misses.len() * n);
        for &e in &self.misses {
            match ahead_by_expert.remove(&e) {
                Some(arrays) => out.extend(arrays),
                None => out.extend(from_rest.by_ref().take(n)),
            }
        }
        if out.len() != self.misses.len() * n {
            return Err(Error::Internal("expert reads came back short"));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{GuessRecord, GUESS_MIN_USED, GUESS_TRIAL};

    fn after(issued: u64, used: usize) -> GuessRecord {
        let mut r = GuessRecord { issued, ..Default::default() };
        r.record_use(1, used);
        r
    }

    #[test]
    fn a_layer_stops_guessing_only_when_judged_and_mostly_wrong() {
        let share = |n: u64| (n as f64 * GUESS_MIN_USED) as usize;
        assert!(!after(GUESS_TRIAL - 1, 0).stopped, "judged before its trial");
        assert!(after(GUESS_TRIAL, share(GUESS_TRIAL) - 1).stopped);
        assert!(!after(GUESS_TRIAL, share(GUESS_TRIAL)).stopped);
        assert!(!after(10 * GUESS_TRIAL, share(10 * GUESS_TRIAL) + 1).stopped);
    }
}
