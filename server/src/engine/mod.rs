//! Generation: prefill, decode steps, sampling, stopping.

pub mod generate;
pub mod sampler;
pub mod stop;

pub use generate::{GenerateOptions, Generator, StepOutput};
pub use sampler::{Sampler, SamplingParams};
pub use stop::{FinishReason, StopMatcher};
