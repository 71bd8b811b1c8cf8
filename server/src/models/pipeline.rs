//! Pipeline parallelism: each rank of a distributed group holds a run of
//! whole layers, mlx-lm's split — in reverse, so the last rank runs the first
//! layers and rank 0 the last. A forward pass receives the hidden state from
//! the rank after this one, runs this rank's layers and sends the result to
//! the rank before; rank 0's output is then gathered by every rank, so all
//! compute the same logits (and sample the same tokens).

use std::ops::Range;
use std::sync::Arc;

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::{ops, Array};

use super::speculative_step::run_layers;
use super::weights::Sharding;
use crate::error::{Error, Result};
use crate::experts::ExpertStream;
use crate::kv::{LayerCache, ModelCache, StepMemo};

/// How a stage hands its output to the next stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Sent to the rank before it (ring, MPI, JACCL).
    Send,
    /// An all-gather at every stage boundary, every rank taking part: the
    /// next stage takes the part of the rank that ran. Costs `ranks` times
    /// the bytes of a send, for backends without sends (NCCL in MLX).
    Gather,
}

/// This rank's part of the pipeline (all layers when there is none).
#[derive(Clone)]
pub struct PipelineStage {
    group: Option<(Group, Transfer)>,
    /// The layers this rank holds and runs, by their index in the model.
    pub layers: Range<usize>,
    /// The model's streamed experts, whose decode steps may run
    /// speculatively (`models::speculative_step`).
    experts: Option<Arc<ExpertStream>>,
}

impl PipelineStage {
    /// The stage `sharding` gives this rank of a model of `num_layers` layers.
    pub fn of(sharding: &Sharding, num_layers: usize) -> Result<PipelineStage> {
        let (group, transfer) = match sharding {
            Sharding::Pipeline(g, transfer) if g.size() > 1 => (g, *transfer),
            _ => return Ok(PipelineStage { group: None, layers: 0..num_layers, experts: None }),
        };
        let (rank, size) = (group.rank(), group.size());
        if num_layers < size {
            return Err(Error::Config(format!(
                "pipeline parallelism over {size} ranks needs at least one layer each; the model has {num_layers}"
            )));
        }
        let layers = Self::split(size, num_layers).swap_remove(rank);
        Ok(PipelineStage { group: Some((group.clone(), transfer)), layers, experts: None })
    }

    /// The stage of a model whose routed experts stream from disk (`stream`,
    /// from `Weights::streaming`): its forward passes may speculate.
    pub fn with_experts(self, stream: Option<Arc<ExpertStream>>) -> PipelineStage {
        PipelineStage { experts: stream, ..self }
    }

    /// Every stage's layers, by rank, over `size` ranks (at least one layer
    /// each): an even split, the low ranks taking the extra layers; rank r
    /// runs the layers after those of ranks r+1 .. size-1.
    fn split(size: usize, num_layers: usize) -> Vec<Range<usize>> {
        let (base, extra) = (num_layers / size, num_layers % size);
        let count = |r: usize| base + usize::from(r < extra);
        (0..size)
            .map(|rank| {
                let start: usize = (rank + 1..size).map(count).sum();
                start..start + count(rank)
            })
            .collect()
    }

    /// The layers of every rank's stage under `sharding` (one stage of all
    /// layers without a pipeline), by rank: for checks every rank must make
    /// alike, such as a model refusing a split.
    pub fn all_of(sharding: &Sharding, num_layers: usize) -> Vec<Range<usize>> {
        match sharding {
            Sharding::Pipeline(g, _) if g.size() > 1 && num_layers >= g.size() => Self::split(g.size(), num_layers),
            _ => std::iter::once(0..num_layers).collect(),
        }
    }

    /// Whether tensor `name` belongs to a decoder layer another rank holds
    /// (never without a pipeline: a stray layer's tensors then stay unused,
    /// and the load reports them).
    pub fn foreign(&self, name: &str) -> bool {
        if self.group.is_none() {
            return false;
        }
        let layer = name.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        layer.is_some_and(|i| !self.layers.contains(&i))
    }

    /// Runs this rank's `layers` in the pipeline: on the embedding `h` at the
    /// rank running the model's first layers, else on what the stage before
    /// hands on; then hands the output on. Returns the model's last hidden
    /// state (rank 0's), the same on every rank, and the transfer that must
    /// run even if nothing reads the result (keep it in the cache's pending
    /// work, so a prefill that evaluates only the cache still hands on).
    pub fn run(&self, h: Array, layers: impl FnOnce(Array) -> Result<Array>) -> Result<(Array, Option<Array>)> {
        let Some((g, transfer)) = &self.group else { return Ok((layers(h)?, None)) };
        let (rank, size, rows) = (g.rank(), g.size(), h.dim(0)?);
        let (out, pending) = match transfer {
            Transfer::Send => {
                let input = if rank + 1 < size { g.recv_like(&h, rank + 1)? } else { h };
                let out = layers(input)?;
                if rank > 0 {
                    let sent = g.send(&out, rank - 1)?;
                    (sent.clone(), Some(sent))
                } else {
                    (out, None)
                }
            }
            Transfer::Gather => {
                // Boundary b hands rank b's output to rank b-1, from the last
                // rank's down to rank 1's. Every rank takes part in each, in
                // this order: a rank that has nothing to hand on gives zeros
                // that depend on the boundary before, so no rank's MLX
                // evaluates the gathers in another order.
                let zeros_after = |previous: &Option<Array>| -> Result<Array> {
                    match previous {
                        Some(p) => Ok(ops::multiply(&rows_of(p, 0, rows)?, &ops::zeros(&[1], h.dtype())?)?),
                        None => Ok(ops::zeros_like(&h)?),
                    }
                };
                let mut input = (rank + 1 == size).then(|| h.clone());
                let mut layers = Some(layers);
                let mut previous: Option<Array> = None;
                for b in (1..size).rev() {
                    let mine = if rank == b {
                        let run = layers.take().expect("a rank runs its layers once");
                        run(input.take().expect("its input arrived at the boundary before"))?
                    } else {
                        zeros_after(&previous)?
                    };
                    let all = g.all_gather(&mine)?;
                    if rank + 1 == b {
                        input = Some(rows_of(&all, b, rows)?);
                    }
                    previous = Some(all);
                }
                // Rank 0's output; the others give zeros after the last
                // boundary, so every rank gathers it last.
                let out = match layers.take() {
                    Some(run) => run(input.take().expect("rank 1 handed its output on"))?,
                    None => zeros_after(&previous)?,
                };
                (out, previous)
            }
        };
        // Rank 0's output, to every rank.
        let all = g.all_gather(&out)?;
        Ok((rows_of(&all, 0, rows)?, pending))
    }
}

impl PipelineStage {
    /// This rank's layers over `h`, inside [`Self::run`]: `layer(i, h,
    /// caches, masks)` applies layer `i` (its index in the model; its cache,
    /// if it has one, is `caches[i - layers.start]`, the others there for a
    /// layer that reads another's); a decode step over streamed experts may
    /// apply some layers twice (`models::speculative_step`).
    pub fn apply_layers(
        &self,
        caches: &mut [LayerCache],
        masks: &StepMemo,
        h: Array,
        layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
    ) -> Result<Array> {
        run_layers(self.experts.as_deref(), self.layers.clone(), caches, masks, h, layer)
    }

    /// A forward pass over this rank's layers (see [`Self::run`]): `layer(i,
    /// h, cache, masks)` applies layer `i` (its index in the model) with its
    /// cache; a decode step over streamed experts may apply some layers twice
    /// (`models::speculative_step`). The transfer that must run is kept in
    /// `cache`'s pending work. Returns the model's last hidden state.
    pub fn forward(
        &self,
        h: Array,
        cache: &mut ModelCache,
        mut layer: impl FnMut(usize, Array, &mut LayerCache, &StepMemo) -> Result<Array>,
    ) -> Result<Array> {
        let (caches, masks) = cache.for_forward();
        let first = self.layers.start;
        let mut own = |i: usize, h: Array, caches: &mut [LayerCache], masks: &StepMemo| {
            let cache = caches.get_mut(i - first).ok_or(Error::Internal("a layer without its cache in the model's cache"))?;
            layer(i, h, cache, masks)
        };
        let (h, pending) = self.run(h, |h| self.apply_layers(caches, masks, h, &mut own))?;
        if let Some(p) = pending {
            cache.keep_pending(p);
        }
        Ok(h)
    }
}

/// The `rows` rows of `all` that rank `rank` gave to an all-gather.
fn rows_of(all: &Array, rank: usize, rows: i32) -> Result<Array> {
    let mut start = vec![0; all.ndim()];
    let mut stop = all.shape();
    start[0] = rank as i32 * rows;
    stop[0] = start[0] + rows;
    let n = stop.len();
    Ok(ops::slice(all, &start, &stop, &vec![1; n])?)
}

/// Whether `group`'s backend moves arrays between two ranks, as a pipeline's
/// sends do (NCCL's backend in MLX does not): each rank sends a word to the
/// rank before it and takes one from the rank after. Every rank gets the
/// same answer (the sends fail alike on every rank, or work).
pub fn point_to_point_works(group: &Group) -> Result<bool> {
    let (rank, size) = (group.rank(), group.size());
    let word = Array::from_slice(&[rank as i32], &[1])?;
    let mut moved = Vec::new();
    if rank > 0 {
        moved.push(group.send(&word, rank - 1)?);
    }
    if rank + 1 < size {
        moved.push(group.recv_like(&word, rank + 1)?);
    }
    let refs: Vec<&Array> = moved.iter().collect();
    if let Err(e) = mlx_rs_safe::eval(&refs) {
        log::info!("the distributed backend cannot send between ranks ({e})");
        return Ok(false);
    }
    match moved.last() {
        Some(got) if rank + 1 < size && got.to_vec::<i32>()? != [rank as i32 + 1] => {
            Err(Error::Engine(format!("rank {rank} received a wrong word from rank {}", rank + 1)))
        }
        _ => Ok(true),
    }
}
