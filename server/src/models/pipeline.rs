//! Pipeline parallelism: each rank of a distributed group holds a run of
//! whole layers, mlx-lm's split — in reverse, so the last rank runs the first
//! layers and rank 0 the last. A forward pass receives the hidden state from
//! the rank after this one, runs this rank's layers and sends the result to
//! the rank before; rank 0's output is then gathered by every rank, so all
//! compute the same logits (and sample the same tokens).

use std::ops::Range;

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::{ops, Array};

use super::weights::Sharding;
use crate::error::{Error, Result};
use crate::kv::ModelCache;

/// This rank's part of the pipeline (all layers when there is none).
#[derive(Debug, Clone)]
pub struct PipelineStage {
    group: Option<Group>,
    /// The layers this rank holds and runs, by their index in the model.
    pub layers: Range<usize>,
}

impl PipelineStage {
    /// The stage `sharding` gives this rank of a model of `num_layers` layers.
    pub fn of(sharding: &Sharding, num_layers: usize) -> Result<PipelineStage> {
        let group = match sharding {
            Sharding::Pipeline(g) if g.size() > 1 => g,
            _ => return Ok(PipelineStage { group: None, layers: 0..num_layers }),
        };
        let (rank, size) = (group.rank(), group.size());
        if num_layers < size {
            return Err(Error::Config(format!(
                "pipeline parallelism over {size} ranks needs at least one layer each; the model has {num_layers}"
            )));
        }
        // Even split, the low ranks taking the extra layers; rank r runs the
        // layers after those of ranks r+1 .. size-1.
        let (base, extra) = (num_layers / size, num_layers % size);
        let count = |r: usize| base + usize::from(r < extra);
        let start: usize = (rank + 1..size).map(count).sum();
        Ok(PipelineStage { group: Some(group.clone()), layers: start..start + count(rank) })
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

    /// The hidden state this rank's first layer takes: `h` (the embedding) on
    /// the rank running the model's first layers, else what the rank after
    /// this one sends.
    pub fn receive(&self, h: Array) -> Result<Array> {
        match &self.group {
            Some(g) if g.rank() + 1 < g.size() => Ok(g.recv_like(&h, g.rank() + 1)?),
            _ => Ok(h),
        }
    }

    /// Hands this rank's output on, and returns the model's last hidden state
    /// (rank 0's), the same on every rank. The send is kept in `cache`'s
    /// pending work, so a prefill that evaluates only the cache still sends.
    pub fn hand_on(&self, h: Array, cache: &mut ModelCache) -> Result<Array> {
        let Some(g) = &self.group else { return Ok(h) };
        let h = if g.rank() > 0 {
            let sent = g.send(&h, g.rank() - 1)?;
            cache.keep_pending(sent.clone());
            sent
        } else {
            h
        };
        let rows = h.dim(0)?;
        let all = g.all_gather(&h)?;
        let mut stop = all.shape();
        stop[0] = rows;
        let n = stop.len();
        Ok(ops::slice(&all, &vec![0; n], &stop, &vec![1; n])?)
    }
}

/// Checks that `group`'s backend moves arrays between two ranks, as a
/// pipeline does at every step (NCCL's backend in MLX does not): each rank
/// sends a word to the rank before it and takes one from the rank after.
pub fn check_point_to_point(group: &Group) -> Result<()> {
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
    mlx_rs_safe::eval(&refs).map_err(|e| {
        Error::Config(format!(
            "pipeline parallelism sends arrays between ranks, which this distributed backend cannot do ({e}); \
             use --distributed tensor, or --distributed-backend ring"
        ))
    })?;
    match moved.last() {
        Some(got) if rank + 1 < size && got.to_vec::<i32>()? != [rank as i32 + 1] => {
            Err(Error::Engine(format!("rank {rank} received a wrong word from rank {}", rank + 1)))
        }
        _ => Ok(()),
    }
}
