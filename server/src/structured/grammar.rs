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
        self.compile_source(&lark)
    }

    /// The guide of a Lark grammar that [`Guide::source`] gave.
    pub fn compile_source(&self, lark: &str) -> Result<Guide, GrammarError> {
        let factory = self.factory()?;
        let matcher = Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(lark.to_string())));
        match matcher.get_error() {
            Some(e) => Err(GrammarError::Invalid(schema_error(&e))),
            None => Ok(Guide::new(matcher, lark.to_string())),
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
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::structured::{CallSchema, Output};
    use crate::tokenizer::reasoning::THINK_TAGS;
    use crate::tokenizer::tool_calls::ToolCallFormat;

    /// A byte-level tokenizer of single bytes, `<think>` / `</think>` /
    /// `<tool_call>` as added text tokens and `<|im_end|>` as its special end token.
    fn tokenizer() -> (tempfile::TempDir, Arc<Tokenizer>) {
        let mut vocab = serde_json::Map::new();
        let mut next = 256u32;
        for b in 0..=255u32 {
            // GPT-2's byte-to-character map, as the ByteLevel decoder reads it.
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable { char::from_u32(b) } else { next += 1; char::from_u32(next - 1) };
            vocab.insert(c.unwrap().to_string(), json!(b));
        }
        let added = ["<think>", "</think>", "<tool_call>", "<|im_end|>"];
        let added: Vec<_> = added.iter().enumerate().map(|(i, t)| json!({"id": 256 + i, "content": t, "special": *t == "<|im_end|>",
            "single_word": false, "lstrip": false, "rstrip": false, "normalized": false})).collect();
        let json = json!({"version": "1.0", "added_tokens": added, "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}});
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "<|im_end|>"}"#).unwrap();
        let t = Arc::new(Tokenizer::load(dir.path(), None).unwrap());
        (dir, t)
    }

    /// Feeds `text`'s tokens, checking each was allowed; returns whether the grammar is done.
    fn feed(guide: &mut Guide, tokenizer: &Tokenizer, text: &str) -> bool {
        for t in tokenizer.encode(text, false).unwrap() {
            let mut row = vec![0u32; 9];
            guide.fill_allowed(&mut row).unwrap();
            assert!(row[t as usize / 32] >> (t % 32) & 1 == 1, "token {t} of {text:?} not allowed");
            guide.advance(t).unwrap();
        }
        guide.is_done()
    }

    #[test]
    fn after_free_reasoning_the_output_is_the_schemas_json() {
        let (_dir, tokenizer) = tokenizer();
        let grammars = Grammars::new(tokenizer.clone());
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
        let spec = GuideSpec { output: Output::Json(schema), thinking: Some(false), markers: THINK_TAGS };
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<think>any {text} at all</think>\n\n"));
        assert!(feed(&mut g, &tokenizer, "{\"a\": 12}"));
        // Straight to the JSON is fine too; anything else is not allowed.
        let mut g = grammars.compile(&spec).unwrap();
        assert!(feed(&mut g, &tokenizer, "{\"a\": 3}"));
        let mut g = grammars.compile(&spec).unwrap();
        assert!(g.advance(tokenizer.encode("x", false).unwrap()[0]).is_err());
    }

    #[test]
    fn a_forced_hermes_call_is_a_call_of_a_given_tool() {
        let (_dir, tokenizer) = tokenizer();
        let grammars = Grammars::new(tokenizer.clone());
        let functions = vec![CallSchema { name: "get".into(), parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": false}) }];
        let spec = GuideSpec { output: Output::Calls { format: ToolCallFormat::Hermes, functions, parallel: false }, thinking: None, markers: THINK_TAGS };
        let mut g = grammars.compile(&spec).unwrap();
        assert!(feed(&mut g, &tokenizer, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>"));
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<tool_call>\n{\"name\": \""));
        assert!(g.advance(tokenizer.encode("x", false).unwrap()[0]).is_err(), "only `get` may be called");
    }

    #[test]
    fn a_forced_qwen_xml_call_takes_typed_values_and_free_text() {
        let (_dir, tokenizer) = tokenizer();
        let grammars = Grammars::new(tokenizer.clone());
        let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}},
                                "required": ["city", "days"]});
        let functions = vec![CallSchema { name: "weather".into(), parameters }];
        let spec = GuideSpec { output: Output::Calls { format: ToolCallFormat::QwenXml, functions, parallel: false }, thinking: None, markers: THINK_TAGS };
        let call = "<tool_call>\n<function=weather>\n<parameter=city>\nSan Francisco, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let mut g = grammars.compile(&spec).unwrap();
        assert!(feed(&mut g, &tokenizer, call));
        // A required parameter cannot be left out; an integer cannot be text.
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n<parameter="));
        assert!(g.advance(tokenizer.encode("u", false).unwrap()[0]).is_err(), "`days` is required, and comes before `units`");
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n"));
        assert!(g.advance(tokenizer.encode("x", false).unwrap()[0]).is_err(), "`days` is an integer");
    }

    #[test]
    fn a_forced_glm_call_takes_typed_values_and_free_text() {
        let (_dir, tokenizer) = tokenizer();
        let grammars = Grammars::new(tokenizer.clone());
        let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}},
                                "required": ["city", "days"]});
        let functions = vec![CallSchema { name: "weather".into(), parameters }];
        let spec = GuideSpec { output: Output::Calls { format: ToolCallFormat::Glm47, functions, parallel: false }, thinking: None, markers: THINK_TAGS };
        let call = "<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>San Francisco, CA</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        let mut g = grammars.compile(&spec).unwrap();
        assert!(feed(&mut g, &tokenizer, call));
        let parsed = crate::tokenizer::tool_calls::parse(ToolCallFormat::Glm47, call);
        assert_eq!(parsed.tool_calls[0].arguments, r#"{"city":"San Francisco, CA","days":3}"#);
        // A required parameter cannot be left out; an integer cannot be text.
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>"));
        assert!(g.advance(tokenizer.encode("u", false).unwrap()[0]).is_err(), "`days` is required, and comes before `units`");
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>"));
        assert!(g.advance(tokenizer.encode("x", false).unwrap()[0]).is_err(), "`days` is an integer");
    }

    #[test]
    fn a_forced_gemma4_call_is_written_in_gemmas_literals() {
        let (_dir, tokenizer) = tokenizer();
        let grammars = Grammars::new(tokenizer.clone());
        let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}, "days": {"type": "integer"}},
                                "required": ["city", "days"]});
        let functions = vec![CallSchema { name: "weather".into(), parameters }];
        let spec = GuideSpec { output: Output::Calls { format: ToolCallFormat::Gemma4, functions, parallel: false }, thinking: None, markers: THINK_TAGS };
        let call = "<|tool_call>call:weather{city:<|\"|>Paris, FR<|\"|>,days:3,units:<|\"|>metric<|\"|>}<tool_call|>";
        let mut g = grammars.compile(&spec).unwrap();
        assert!(feed(&mut g, &tokenizer, call));
        let parsed = crate::tokenizer::tool_calls::parse(ToolCallFormat::Gemma4, call);
        assert_eq!(parsed.tool_calls[0].arguments, r#"{"city":"Paris, FR","days":3,"units":"metric"}"#);
        // `days` is required and an integer.
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<|tool_call>call:weather{city:<|\"|>Paris<|\"|>,"));
        assert!(g.advance(tokenizer.encode("u", false).unwrap()[0]).is_err(), "`days` comes next");
        let mut g = grammars.compile(&spec).unwrap();
        assert!(!feed(&mut g, &tokenizer, "<|tool_call>call:weather{city:<|\"|>Paris<|\"|>,days:"));
        assert!(g.advance(tokenizer.encode("x", false).unwrap()[0]).is_err(), "`days` is an integer");
    }

    #[test]
    fn schema_errors_lose_the_grammar_excerpt() {
        let e = "at 1(8): failed to compile JSON schema: Unimplemented keys: [\"uniqueItems\"]\n   1 | start: %json {}\n   ^\n";
        assert_eq!(super::schema_error(e), "failed to compile JSON schema: Unimplemented keys: [\"uniqueItems\"]");
    }
}
