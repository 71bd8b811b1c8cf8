//! Generation: prefill, decode steps, sampling, stopping.

pub mod generate;
pub mod group;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod stop;

pub use generate::{GenerateOptions, Generator, StepOutput};
pub use sampler::{Sampler, SamplingParams};
pub use request::{Event, Generation, Request, TokenLogprob, Usage};
pub use scheduler::{EngineConfig, EngineHandle, EngineStats, SubmitError};
pub use stop::{FinishReason, StopMatcher};
