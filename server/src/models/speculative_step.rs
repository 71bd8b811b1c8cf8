//! The layer loop of a forward pass, with speculative decode steps over
//! streamed experts (`experts::speculation`): a decode step runs every layer
//! on the experts the slots hold and checks the routers' choices once at the
//! end; if a layer lacked one, the step is undone from that layer (each later
//! layer's cache returns to where it was: it drops the position it appended,
//! or takes back its earlier arrays: a recurrent state, a sliding window that
//! overwrote a position), the experts it now knows of are installed, and it
//! runs again from that layer's input, speculatively up to
//! `SPECULATIVE_PASSES` passes in all, then per layer (each streamed layer
//! reading its choice back and reading what it lacks) — at once where that
//! layer chose more experts than it has slots (a batch's union), which only
//! the per-layer path runs. The output is the same either way, token for
//! token.
//!
//! A step speculates only with one token per row and every layer's cache able
//! to return (`KvStore::undo_point`).

use std::ops::Range;

use mlx_rs_safe::Array;

use crate::error::{Error, Result};
use crate::experts::speculation::{Verdict, SPECULATIVE_PASSES};
use crate::experts::ExpertStream;
use crate::kv::{LayerCache, StepMemo, UndoPoint};

/// Applies the layers `layers` (model indices; `caches` holds the caches of
/// those that have one, layer `i`'s at `i - layers.start`, all given to
/// `layer` for a layer that reads another's) to `h` in turn, speculatively
/// where `experts` allows it (see the module's text).
pub fn run_layers(
    experts: Option<&ExpertStream>,
    layers: Range<usize>,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    h: Array,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<Array> {
    let Some(stream) = experts.filter(|_| h.dim(1).is_ok_and(|l| l == 1)) else {
        return run_from(layers, caches, masks, h, layer);
    };
    let undo: Option<Vec<Vec<UndoPoint>>> = if stream.speculates() { caches.iter().map(|c| c.undo_point(1)).collect() } else { None };
    let Some(undo) = undo else {
        // Whether this step would have run again, for the next ones' choice.
        let misses = stream.reader.counters().misses();
        let out = run_from(layers, caches, masks, h, layer)?;
        stream.observe_step(stream.reader.counters().misses() > misses);
        return Ok(out);
    };
    // Each layer's input in the latest pass: where a step runs again from.
    let mut inputs = Vec::with_capacity(layers.len());
    let mut h = h;
    let mut from = layers.start;
    for pass in 1..=SPECULATIVE_PASSES {
        stream.reader.counters().record_speculative_pass(pass);
        stream.begin_speculation();
        let ran = speculative_pass(stream, from..layers.end, caches, masks, h, &mut inputs, layer);
        let (out, verdict) = ran.inspect_err(|_| stream.abandon_speculation())?;
        let (miss, again) = match verdict {
            Verdict::Confirmed => {
                stream.observe_step(pass > 1);
                return Ok(out);
            }
            Verdict::Replay { from } => (from as usize, true),
            Verdict::PerLayer { from } => (from as usize, false),
        };
        if !layers.contains(&miss) {
            return Err(Error::Internal("a speculative step missed in a layer this stage does not run"));
        }
        from = miss;
        // The caches of the layers from the miss on (a layer without one has
        // nothing to undo: it read an earlier layer's).
        let j = (from - layers.start).min(caches.len());
        for (c, points) in caches[j..].iter_mut().zip(&undo[j..]) {
            c.undo(points)?;
        }
        inputs.truncate(from - layers.start + 1);
        h = inputs.pop().ok_or(Error::Internal("a speculative step without the input of the layer it runs again from"))?;
        if !again {
            if pass == 1 {
                stream.reader.counters().record_replay_per_layer();
            }
            break;
        }
    }
    stream.observe_step(true);
    run_from(from..layers.end, caches, masks, h, layer)
}

/// One speculative pass over `layers`, their inputs appended to `inputs`;
/// the pass's output and what its end found.
fn speculative_pass(
    stream: &ExpertStream,
    layers: Range<usize>,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    mut h: Array,
    inputs: &mut Vec<Array>,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<(Array, Verdict)> {
    for i in layers {
        inputs.push(h.clone());
        h = layer(i, h, caches, masks)?;
    }
    let verdict = stream.end_speculation(&h)?;
    Ok((h, verdict))
}

/// Applies `layers` in turn, without speculation.
fn run_from(
    layers: Range<usize>,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    mut h: Array,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<Array> {
    for i in layers {
        h = layer(i, h, caches, masks)?;
    }
    Ok(h)
}
