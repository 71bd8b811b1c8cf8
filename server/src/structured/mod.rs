//! Structured output: a request's output constrained to a grammar, token by
//! token. The API turns `response_format` and forced tool calls into a Lark
//! grammar ([`GuideSpec`]); [`Grammars`] compiles it with llguidance against
//! the model's vocabulary into a [`Guide`], which travels with the request;
//! the engine asks each row's guide for the tokens allowed at the next step
//! (while the GPU runs the step's model call) and masks the logits with them.

mod grammar;
mod guide;
mod spec;
mod vocab;

pub use grammar::{GrammarError, Grammars};
pub use guide::Guide;
pub use spec::{CallSchema, GuideSpec, Output};
