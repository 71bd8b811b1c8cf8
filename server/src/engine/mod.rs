//! Generation: the engine loop, prefill, the decode batch, sampling, stopping.

mod batch;
mod core;
mod handle;
mod lockstep;
mod policy;
mod request;
mod sampler;
mod sequence;
mod stats;
mod stop;
mod token_mask;

pub use self::core::{Engine, EngineConfig, WarmUp, WARM_HISTORY};
pub use handle::{Arriving, EngineHandle, Failure, SubmitError};
pub use lockstep::follow;
pub use policy::Policy;
pub use request::{Event, Generation, PromptProgress, Request, TokenLogprob, Usage};
pub use sampler::{Sampler, SamplingParams};
pub use stats::{EngineSnapshot, EngineStats};
pub use stop::{FinishReason, StopMatcher};
