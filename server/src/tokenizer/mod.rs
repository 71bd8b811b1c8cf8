//! Tokenizer, chat template and end-of-sequence ids of a model folder (or of
//! a GGUF file: see `crate::gguf`).
//!
//! Reads what transformers' AutoTokenizer reads: `tokenizer.json` (the `tokenizers`
//! crate), `tokenizer_config.json` (special tokens, `chat_template`), a
//! `chat_template.jinja` or `chat_template.json` file when present, and the eos ids
//! of `config.json` and `generation_config.json`.

mod byte_bound;
mod chat_template;
mod detokenizer;
pub mod gemma4;
pub mod glm;
pub mod harmony;
pub mod qwen_xml;
pub mod reasoning;
pub mod tool_calls;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

pub use chat_template::{ChatTemplate, TemplateTokens};
pub use detokenizer::StreamingDetokenizer;

use crate::error::{Error, Result};

/// How a chat is rendered: the tools the template shows, whether it opens the
/// assistant's turn, and extra template variables (`chat_template_kwargs`).
#[derive(Debug, Clone, Copy)]
pub struct ChatRender<'a> {
    pub tools: Option<&'a Value>,
    pub add_generation_prompt: bool,
    pub kwargs: Option<&'a Value>,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    /// The template's source text (tool-call formats are recognised from it).
    template_source: Option<String>,
    tokens: TemplateTokens,
    eos_ids: BTreeSet<u32>,
    /// The most bytes of text one token stands for, where the tokenizer bounds it.
    max_bytes_per_token: Option<usize>,
    /// Template variables every chat gets unless it sets them itself
    /// (`--chat-template-args`).
    default_kwargs: Option<Value>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::model_file(path, format!("invalid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::model_file(path, e.to_string())),
    }
}

/// A special token in tokenizer_config.json: a string or an AddedToken object.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id` as an int or a list of ints.
fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

/// The chat template source: chat_template.jinja, chat_template.json, else
/// tokenizer_config.json's `chat_template` (a string or a list of named templates).
fn template_source(dir: &Path, config: Option<&Value>) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| Error::model_file(&jinja, e.to_string()));
    }
    let json_path = dir.join("chat_template.json");
    let from_json = read_json(&json_path)?;
    let field = from_json.as_ref().or(config).and_then(|c| c.get("chat_template"));
    Ok(match field {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| named.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    })
}

impl Tokenizer {
    /// Loads the tokenizer of the model folder (or GGUF file) `dir`.
    /// `template_override` replaces the model's chat template (the
    /// `--chat-template` file's text).
    pub fn load(dir: &Path, template_override: Option<&str>) -> Result<Tokenizer> {
        if let Some(file) = crate::gguf::locate(dir)? {
            let parts = crate::gguf::GgufModel::open(&file)?.tokenizer()?;
            let source = template_override.map(str::to_string).or(parts.chat_template);
            return Tokenizer::assemble(&file, &parts.json, parts.tokens, source, parts.eos_ids.into_iter().collect());
        }
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.exists() {
            return Err(Error::model_file(&tok_path, "missing: the model folder has no tokenizer.json"));
        }
        let text = std::fs::read_to_string(&tok_path).map_err(|e| Error::model_file(&tok_path, format!("cannot load: {e}")))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let tokens = TemplateTokens {
            bos_token: token_text(config.as_ref().and_then(|c| c.get("bos_token"))),
            eos_token: token_text(config.as_ref().and_then(|c| c.get("eos_token"))),
            pad_token: token_text(config.as_ref().and_then(|c| c.get("pad_token"))),
            unk_token: token_text(config.as_ref().and_then(|c| c.get("unk_token"))),
        };
        let source = match template_override {
            Some(s) => Some(s.to_string()),
            None => template_source(dir, config.as_ref())?,
        };
        let mut eos_ids = BTreeSet::new();
        for file in ["config.json", "generation_config.json"] {
            if let Some(v) = read_json(&dir.join(file))? {
                eos_ids.extend(ids_of(v.get("eos_token_id")));
            }
        }
        Tokenizer::assemble(&tok_path, &text, tokens, source, eos_ids)
    }

    /// A word-level tokenizer of two words ("a" 0, "b" 1), loaded from a
    /// temporary model folder: for unit tests that need a tokenizer but not
    /// its words.
    #[cfg(test)]
    pub fn two_words() -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let json = r#"{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}, "unk_token": "a"}}"#;
        std::fs::write(dir.path().join("tokenizer.json"), json).unwrap();
        Tokenizer::load(dir.path(), None).unwrap()
    }

    /// A tokenizer from tokenizer.json's text (read from `origin`, named in
    /// errors), its special tokens, chat template and end-of-sequence ids.
    fn assemble(origin: &Path, text: &str, tokens: TemplateTokens, source: Option<String>, mut eos_ids: BTreeSet<u32>) -> Result<Tokenizer> {
        let inner: tokenizers::Tokenizer =
            text.parse().map_err(|e| Error::model_file(origin, format!("cannot load the tokenizer: {e}")))?;
        // The tokenizers crate parsed it, so it is JSON.
        let max_bytes_per_token = serde_json::from_str(text).ok().as_ref().and_then(byte_bound::max_bytes_per_token);
        let template = source.as_deref().map(ChatTemplate::new).transpose()?;
        if let Some(id) = tokens.eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.insert(id);
        }
        Ok(Tokenizer { inner, template, template_source: source, tokens, eos_ids, max_bytes_per_token, default_kwargs: None })
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn eos_ids(&self) -> &BTreeSet<u32> {
        &self.eos_ids
    }

    /// How this model marks reasoning: Gemma 4's thought channel where the
    /// vocabulary has its tokens (as mlx-lm decides), else `<think>` tags.
    pub fn think_markers(&self) -> reasoning::ThinkMarkers {
        match (self.inner.token_to_id("<|channel>"), self.inner.token_to_id("<channel|>")) {
            (Some(_), Some(_)) => reasoning::GEMMA4_THOUGHT,
            _ => reasoning::THINK_TAGS,
        }
    }

    /// Whether the model writes reasoning blocks: its chat template handles
    /// their end, or its vocabulary has Gemma 4's thought channel.
    pub fn thinks(&self) -> bool {
        let markers = self.think_markers();
        markers == reasoning::GEMMA4_THOUGHT || self.chat_template_source().is_some_and(|t| reasoning::template_thinks(t, markers))
    }

    pub fn chat_template_source(&self) -> Option<&str> {
        self.template_source.as_deref()
    }

    /// The most bytes of text one token can stand for (None: not bounded for
    /// this tokenizer), so a text longer than `context × this` cannot fit.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        self.max_bytes_per_token
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer's
    /// post-processor adds (e.g. BOS), as transformers' `encode` does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // encode_fast: the same ids without character offsets, which we never read.
        let enc = self.inner.encode_fast(text, add_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The id of the special token whose text is `text` (one the decoder
    /// skips, so a stop string naming it must match its id, as mlx-lm's
    /// token-id stop sequences do).
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        self.inner.get_added_tokens_decoder().into_iter().find(|(_, t)| t.special && t.content == text).map(|(id, _)| id)
    }

    /// The tokens XTC sampling never drops, as mlx_lm.server picks them: the
    /// encoding of "\n" (special tokens added, as its `encode` adds them)
    /// and the end tokens.
    pub fn xtc_special_tokens(&self) -> Result<Vec<u32>> {
        let mut ids = self.encode("\n", true)?;
        ids.extend(self.eos_ids().iter().copied());
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The prompt text for `messages` through the chat template.
    pub fn apply_chat_template(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat(messages, &ChatRender { tools, add_generation_prompt, kwargs: None })
    }

    /// Sets the template variables every chat gets unless it sets them itself.
    pub fn set_default_template_kwargs(&mut self, kwargs: Option<Value>) {
        self.default_kwargs = kwargs;
    }

    /// The chat's text through the model's template (the default variables
    /// under the chat's own); a model without one (a base model) gets
    /// mlx_lm.server's plain "USER: …" transcript.
    pub fn render_chat(&self, messages: &Value, how: &ChatRender) -> Result<String> {
        let Some(t) = &self.template else { return Ok(plain_transcript(messages, how.add_generation_prompt)) };
        let merged = match (&self.default_kwargs, how.kwargs) {
            (Some(Value::Object(defaults)), Some(Value::Object(own))) => {
                let mut all = defaults.clone();
                all.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
                Some(Value::Object(all))
            }
            (defaults, own) => own.cloned().or_else(|| defaults.clone()),
        };
        t.render_with_kwargs(messages, how.tools, how.add_generation_prompt, merged.as_ref(), &self.tokens)
    }

    /// Token ids of a chat, as mlx-lm tokenizes it: the rendered template already
    /// holds the special tokens, so none are added.
    pub fn encode_chat(&self, messages: &Value, tools: Option<&Value>) -> Result<Vec<u32>> {
        let how = ChatRender { tools, add_generation_prompt: true, kwargs: None };
        self.encode_chat_checked(messages, &how, |_| Ok::<(), Error>(()))
    }

    /// [`Self::encode_chat`] rendered as `how` says, with `check` seeing the
    /// rendered text first: it may refuse the text before the (costly)
    /// tokenizing.
    pub fn encode_chat_checked<E: From<Error>>(
        &self,
        messages: &Value,
        how: &ChatRender,
        check: impl FnOnce(&str) -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<u32>, E> {
        let text = self.render_chat(messages, how)?;
        check(&text)?;
        // A template writes the special tokens itself; the plain transcript
        // is encoded as mlx_lm.server encodes it, with them added (BOS).
        Ok(self.encode(&text, self.template.is_none())?)
    }

    pub fn new_detokenizer(&self) -> StreamingDetokenizer {
        StreamingDetokenizer::new(true)
    }
}

/// mlx_lm.server's `convert_chat` with its default role mapping: each
/// message as "PREFIX content\n" (system "ASSISTANT's RULE: ", user "USER: ",
/// assistant "ASSISTANT: ", other roles no prefix), then "ASSISTANT: " when
/// the answer follows, trailing whitespace trimmed.
fn plain_transcript(messages: &Value, add_generation_prompt: bool) -> String {
    let prefix = |role: &str| match role {
        "system" => "ASSISTANT's RULE: ",
        "user" => "USER: ",
        "assistant" => "ASSISTANT: ",
        _ => "",
    };
    let mut text = String::new();
    for m in messages.as_array().into_iter().flatten() {
        let content = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        text.push_str(prefix(m["role"].as_str().unwrap_or("")));
        text.push_str(&content);
        text.push('\n');
    }
    if add_generation_prompt {
        text.push_str("ASSISTANT: ");
    }
    text.trim_end().to_string()
}

