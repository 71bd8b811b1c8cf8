//! The layer loop of a forward pass, with speculative decode steps over
//! streamed experts (`experts::speculation`): a decode step runs every layer
//! on the experts the slots hold and checks the routers' choices once at the
//! end; if a layer lacked one, the step is undone from that layer (each later
//! layer's cache returns to where it was: it drops the position it appended,
//! or takes back its earlier arrays: a recurrent state, a sliding window that
//! overwrote a position), the experts it now knows of are installed, and it
//! runs again from that layer's input, speculatively up to
//! `SPECULATIVE_PASSES` passes in all, then per layer (each streamed layer
//! reading its choice back and reading what it lacks). The output is the same
//! either way, token for token.
//!
//! A step speculates only with one token per row and every layer's cache able
//! to return (`KvStore::undo_point`).

use mlx_rs_safe::Array;

use crate::error::{Error, Result};
use crate::experts::speculation::{Verdict, SPECULATIVE_PASSES};
use crate::experts::ExpertStream;
use crate::kv::{LayerCache, StepMemo, UndoPoint};

/// Applies layer `first + j` (whose cache is `caches[j]`; `layer` gets them
/// all, for a layer that reads another's) to `h`, for every cache in turn,
/// speculatively where `experts` allows it (see the module's text).
pub fn run_layers(
    experts: Option<&ExpertStream>,
    first: usize,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    h: Array,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<Array> {
    let Some(stream) = experts.filter(|_| h.dim(1).is_ok_and(|l| l == 1)) else {
        return run_from(0, first, caches, masks, h, layer);
    };
    let undo: Option<Vec<Vec<UndoPoint>>> = if stream.speculates() { caches.iter().map(|c| c.undo_point(1)).collect() } else { None };
    let Some(undo) = undo else {
        // Whether this step would have run again, for the next ones' choice.
        let misses = stream.reader.counters().misses();
        let out = run_from(0, first, caches, masks, h, layer)?;
        stream.observe_step(stream.reader.counters().misses() > misses);
        return Ok(out);
    };
    // Each layer's input in the latest pass: where a step runs again from.
    let mut inputs = Vec::with_capacity(caches.len());
    let mut h = h;
    let mut from = 0;
    for pass in 1..=SPECULATIVE_PASSES {
        stream.reader.counters().record_speculative_pass(pass);
        stream.begin_speculation();
        let ran = speculative_pass(stream, from, first, caches, masks, h, &mut inputs, layer);
        let (out, verdict) = ran.inspect_err(|_| stream.abandon_speculation())?;
        let miss = match verdict {
            Verdict::Confirmed => {
                stream.observe_step(pass > 1);
                return Ok(out);
            }
            Verdict::Replay { from } => from,
        };
        from = (miss as usize).checked_sub(first).filter(|&j| j < caches.len()).ok_or(Error::Internal("a speculative step missed in a layer this stage does not run"))?;
        for (c, points) in caches[from..].iter_mut().zip(&undo[from..]) {
            c.undo(points)?;
        }
        inputs.truncate(from + 1);
        h = inputs.pop().ok_or(Error::Internal("a speculative step without the input of the layer it runs again from"))?;
    }
    stream.observe_step(true);
    run_from(from, first, caches, masks, h, layer)
}

/// One speculative pass over the layers from `caches[from]` on, their inputs
/// appended to `inputs`; the pass's output and what its end found.
#[allow(clippy::too_many_arguments)]
fn speculative_pass(
    stream: &ExpertStream,
    from: usize,
    first: usize,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    mut h: Array,
    inputs: &mut Vec<Array>,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<(Array, Verdict)> {
    for j in from..caches.len() {
        inputs.push(h.clone());
        h = layer(first + j, h, caches, masks)?;
    }
    let verdict = stream.end_speculation(&h)?;
    Ok((h, verdict))
}

/// Applies the layers from `caches[from]` on, without speculation.
fn run_from(
    from: usize,
    first: usize,
    caches: &mut [LayerCache],
    masks: &StepMemo,
    mut h: Array,
    layer: &mut impl FnMut(usize, Array, &mut [LayerCache], &StepMemo) -> Result<Array>,
) -> Result<Array> {
    for j in from..caches.len() {
        h = layer(first + j, h, caches, masks)?;
    }
    Ok(h)
}
