//! Compiles a request's grammar against the model's vocabulary. The parser
//! factory (the vocabulary's token trie and lexer slices: ~0.3 s for a 50k
//! vocabulary) is built on the first constrained request, then shared.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

use super::{Guide, GuideSpec};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarError {
    /// This model's tokenizer cannot be read as bytes per token.
    Unavailable(String),
    /// The schema or grammar does not compile (unsupported keyword, bad value, ...).
    Invalid(String),
}

impl std::fmt::Display for GrammarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrammarError::Unavailable(e) => write!(f, "structured output is not available for this model's tokenizer: {e}"),
            GrammarError::Invalid(e) => write!(f, "{e}"),
        }
    }
}

pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Grammars {
        Grammars { tokenizer, factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&ParserFactory, GrammarError> {
        let built = self.factory.get_or_init(|| {
            let start = std::time::Instant::now();
            let env = super::vocab::token_env(self.tokenizer.clone())?;
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            // Errors come back as values (a 400 for the client), not log lines.
            factory.quiet();
            log::info!("structured output: vocabulary indexed in {:.0} ms", start.elapsed().as_secs_f64() * 1e3);
            Ok(factory)
        });
        built.as_ref().map_err(|e| GrammarError::Unavailable(e.clone()))
    }

    /// A marker string as a grammar item: the special token it names, or its text.
    fn literal(&self, factory: &ParserFactory, text: &str) -> String {
        let trie = factory.tok_env().tok_trie();
        match self.tokenizer.inner().token_to_id(text) {
            Some(id) if trie.is_special_token(id) => format!("<[{id}]>"),
            _ => serde_json::to_string(text).unwrap_or_default(),
        }
    }

    /// The guide of `spec` (blocking: run it off the async threads).
    pub fn compile(&self, spec: &GuideSpec) -> Result<Guide, GrammarError> {
        let factory = self.factory()?;
        let lark = spec.lark(|text| self.literal(factory, text));
        let matcher = Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(lark)));
        match matcher.get_error() {
            Some(e) => Err(GrammarError::Invalid(schema_error(&e))),
            None => Ok(Guide::new(matcher)),
        }
    }
}

/// llguidance's compile error without what concerns our generated grammar
/// rather than the client's schema: the `at line(column): ` prefix and the
/// grammar excerpt after the first line.
fn schema_error(e: &str) -> String {
    let first = e.lines().next().unwrap_or(e);
    let message = match first.split_once("): ") {
        Some((at, rest)) if at.starts_with("at ") => rest,
        _ => first,
    };
    message.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn schema_errors_lose_the_grammar_excerpt() {
        let e = "at 1(8): failed to compile JSON schema: Unimplemented keys: [\"uniqueItems\"]\n   1 | start: %json {}\n   ^\n";
        assert_eq!(super::schema_error(e), "failed to compile JSON schema: Unimplemented keys: [\"uniqueItems\"]");
    }
}
