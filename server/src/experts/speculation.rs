//! Speculative decode steps: a streamed layer that reads its router's choice
//! back to the host before it can run waits for the device to drain, once per
//! layer and token (on a GPU this, not the disk, bounds decoding when nearly
//! every expert is cached). A speculative step instead runs every layer on the
//! experts its slots hold, routing on the device through each layer's
//! expert → slot map, and reads all the layers' choices back once, with the
//! step's output. If every chosen expert was in its slot, the step is exactly
//! the one the per-layer path computes (the same kernels on the same slots).
//! Otherwise the first layer that lacked one computed a wrong output from then
//! on: the step is undone from that layer and runs again there
//! (`models::speculative_step`).
//!
//! Before the step runs again, what it now knows is read at once and written
//! into the slots: the missing experts of the first layer that lacked some
//! (its choice was right: its input was), and those the later layers chose on
//! their slightly wrong input (most of them what they choose again), up to
//! [`REPLAY_READ_BYTES`]. So the next pass, again speculative, usually finds
//! every expert; a step runs at most [`SPECULATIVE_PASSES`] such passes, then
//! the rest per layer.
//!
//! Where it pays: a step that runs again costs the layers after the miss
//! twice, and the read-backs it saves cost little on the CPU (no device
//! queue to drain). On a GPU (H200, Qwen3-30B-A3B's shapes) it doubles decode
//! speed where one step in six lacks an expert, and costs a tenth where five
//! in six do (the read-backs then hide behind the reads). So by default
//! (`--expert-speculation auto`) decode steps speculate on a GPU while fewer
//! than half of the recent decode steps lacked an expert ([`MissRate`]:
//! whether a step lacked one is known either way, from its lookups).

use mlx_rs_safe::{ops, Array, Dtype};

use std::sync::Arc;

use super::{ExpertStream, StreamedLayer};
use crate::error::{Error, Result};

/// Bytes of experts read before a step runs again, beyond the first missing
/// layer's own: reads of guesses are bounded like the staging they need.
pub const REPLAY_READ_BYTES: u64 = 512 << 20;

/// Speculative passes of one step at most; a step still lacking an expert
/// after them runs its remaining layers reading back per layer.
pub const SPECULATIVE_PASSES: u64 = 3;

/// When decode steps speculate (`--expert-speculation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculation {
    /// On a GPU while fewer than half of the recent decode steps lacked an
    /// expert ([`MissRate`]); never on the CPU.
    Auto,
    On,
    Off,
}

impl Speculation {
    pub fn parse(s: &str) -> Result<Speculation> {
        match s {
            "auto" => Ok(Speculation::Auto),
            "on" => Ok(Speculation::On),
            "off" => Ok(Speculation::Off),
            _ => Err(Error::Config(format!("--expert-speculation must be auto, on or off, got {s:?}"))),
        }
    }

    /// Whether a step on the engine thread's current device speculates, when
    /// `missing` is the share of recent decode steps that lacked an expert.
    fn now(self, missing: f64) -> bool {
        match self {
            Speculation::On => true,
            Speculation::Off => false,
            Speculation::Auto => missing < MissRate::SPECULATE_BELOW && mlx_rs_safe::kernels::current_gpu_backend().is_some(),
        }
    }
}

/// The share of recent decode steps that lacked an expert (in some layer),
/// an exponential average over about the last [`MissRate::WINDOW`] steps. It
/// starts at one, as if every step had lacked one: a cache just filled by a
/// prefill misses most at first, and a step that runs again where most do
/// costs more than speculation saves (its guesses read and evict in vain), so
/// speculation begins once about a dozen steps in a row found every expert.
#[derive(Debug)]
pub struct MissRate {
    share: f64,
}

impl Default for MissRate {
    fn default() -> MissRate {
        MissRate { share: 1.0 }
    }
}

impl MissRate {
    const WINDOW: f64 = 16.0;
    /// Auto speculation stops at this share and resumes below it.
    pub const SPECULATE_BELOW: f64 = 0.5;

    pub fn observe(&mut self, lacked: bool) {
        self.share += (f64::from(u8::from(lacked)) - self.share) / Self::WINDOW;
    }

    pub fn share(&self) -> f64 {
        self.share
    }
}

/// The layers' choices of a speculative step, queued on the device.
#[derive(Default)]
pub struct StepRecord {
    /// (layer, its router's expert ids as flat uint32), in the order run.
    choices: Vec<(u32, Array)>,
}

/// What the end of a speculative step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every layer's experts were in their slots: the output stands.
    Confirmed,
    /// Layer `from` lacked an expert: undo the step from that layer and run
    /// it again from there.
    Replay { from: u32 },
    /// Layer `from` chose more experts than it has slots (a batch's union):
    /// no speculative pass can run it, so the step is undone from there and
    /// goes on per layer.
    PerLayer { from: u32 },
}

impl ExpertStream {
    /// Whether a decode step run now may speculate (`--expert-speculation`).
    pub fn speculates(&self) -> bool {
        self.speculate.now(self.miss_rate.lock().unwrap_or_else(|e| e.into_inner()).share())
    }

    /// Records whether a decode step (speculative or not) lacked an expert.
    pub fn observe_step(&self, lacked: bool) {
        self.miss_rate.lock().unwrap_or_else(|e| e.into_inner()).observe(lacked);
    }

    /// Starts a speculative step: until [`Self::end_speculation`], streamed
    /// layers route on the device and record their choice.
    pub fn begin_speculation(&self) {
        *self.step.lock().unwrap_or_else(|e| e.into_inner()) = Some(StepRecord::default());
    }

    /// Whether a speculative step is under way.
    pub fn speculating(&self) -> bool {
        self.step.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Records layer `layer`'s router choice (`indices`, any shape) in the
    /// step under way.
    pub fn record_choice(&self, layer: u32, indices: &Array) -> Result<()> {
        let flat = ops::reshape(&ops::astype(indices, Dtype::Uint32)?, &[-1])?;
        match self.step.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(step) => {
                step.choices.push((layer, flat));
                Ok(())
            }
            None => Err(Error::Internal("a speculative choice outside a speculative step")),
        }
    }

    /// Ends the step without a verdict (it failed): nothing is recorded.
    pub fn abandon_speculation(&self) {
        self.step.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Ends a speculative pass: evaluates `out` (its last hidden state) with
    /// every recorded choice, in one read-back, and checks each layer's choice
    /// against its slots in layer order. Layers before the first that lacked
    /// an expert record their hits; from that one on, the experts the pass
    /// chose and the slots lack are read and installed for the next.
    pub fn end_speculation(&self, out: &Array) -> Result<Verdict> {
        let step = self.step.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(StepRecord { choices }) = step else { return Err(Error::Internal("a speculative step ended that never began")) };
        if choices.is_empty() {
            // Every streamed layer holds all its experts: nothing was guessed.
            return Ok(Verdict::Confirmed);
        }
        let parts: Vec<&Array> = choices.iter().map(|(_, ids)| ids).collect();
        let all = ops::concatenate(&parts, 0)?;
        self.reader.counters().record_host_sync();
        mlx_rs_safe::eval(&[&all, out])?;
        let ids = all.to_vec::<u32>()?;
        let mut replaying = Vec::new();
        let first_miss = match self.start_replay_reads(&choices, &ids, &mut replaying) {
            Ok(m) => m,
            Err(e) => {
                // No reads are left pending for a step that will not come.
                for l in &replaying {
                    l.abandon_replay();
                }
                return Err(e);
            }
        };
        // All reads were started before any is waited for; every layer's are
        // collected even if one failed, so none is left pending.
        let installed: Vec<Result<()>> = replaying.iter().map(|l| l.install_for_replay()).collect();
        installed.into_iter().collect::<Result<()>>()?;
        Ok(match first_miss {
            None => Verdict::Confirmed,
            Some((from, true)) => Verdict::Replay { from },
            Some((from, false)) => Verdict::PerLayer { from },
        })
    }

    /// Checks each layer's choice (`ids`, the choices' read-back, in their
    /// order) against its slots: layers before the first that lacked an
    /// expert record their hits; from that one on, the reads of what the
    /// layers chose and lack are started (the layers that started any are
    /// pushed to `replaying`). Returns the first layer that lacked an expert
    /// and whether a pass can run it on its slots (else nothing is read).
    fn start_replay_reads(&self, choices: &[(u32, Array)], ids: &[u32], replaying: &mut Vec<Arc<dyn StreamedLayer>>) -> Result<Option<(u32, bool)>> {
        let mut at = 0;
        let mut first_miss = None;
        let mut budget = REPLAY_READ_BYTES;
        for (layer, choice) in choices {
            let mine = ids.get(at..at + choice.size()).ok_or(Error::Internal("a speculative step's choices came back short"))?;
            at += choice.size();
            let streamed = self.layer(*layer).ok_or(Error::Internal("a speculative choice of a layer that does not stream"))?;
            let cap = match first_miss {
                None if streamed.confirm(mine)? => continue,
                None => {
                    first_miss = Some(*layer);
                    usize::MAX
                }
                Some(_) => (budget / streamed.expert_bytes().max(1)) as usize,
            };
            match streamed.read_for_replay(mine, cap)? {
                Some(started) => budget = budget.saturating_sub(started as u64 * streamed.expert_bytes()),
                // The first missing layer cannot run on its slots: nothing
                // is read for a pass that will not run.
                None if first_miss == Some(*layer) => return Ok(Some((*layer, false))),
                None => continue,
            }
            replaying.push(streamed);
        }
        Ok(first_miss.map(|from| (from, true)))
    }
}

#[cfg(test)]
mod tests {
    use super::{MissRate, Speculation};

    #[test]
    fn auto_speculation_stops_once_most_recent_steps_lacked_an_expert_and_resumes() {
        let mut rate = MissRate::default();
        assert!(!Speculation::Auto.now(rate.share()), "no step seen yet");
        for _ in 0..12 {
            rate.observe(false);
        }
        assert!(Speculation::Auto.now(rate.share()) == (mlx_rs_safe::kernels::current_gpu_backend().is_some()));
        // One step in six lacking: stays below.
        for i in 0..60 {
            rate.observe(i % 6 == 0);
        }
        assert!(rate.share() < MissRate::SPECULATE_BELOW, "{}", rate.share());
        // Five in six: above within a window or two.
        for i in 0..32 {
            rate.observe(i % 6 != 0);
        }
        assert!(rate.share() >= MissRate::SPECULATE_BELOW, "{}", rate.share());
        assert!(!Speculation::Auto.now(rate.share()));
        assert!(Speculation::On.now(rate.share()) && !Speculation::Off.now(0.0));
        for _ in 0..16 {
            rate.observe(false);
        }
        assert!(rate.share() < MissRate::SPECULATE_BELOW, "{}", rate.share());
    }

    #[test]
    fn the_flag_takes_auto_on_or_off() {
        assert_eq!(Speculation::parse("auto").unwrap(), Speculation::Auto);
        assert_eq!(Speculation::parse("off").unwrap(), Speculation::Off);
        assert!(Speculation::parse("sometimes").unwrap_err().to_string().contains("--expert-speculation"));
    }
}
