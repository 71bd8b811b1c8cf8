//! Hugging Face chat templates rendered with minijinja, configured the way
//! transformers renders them (trim_blocks, lstrip_blocks, `raise_exception`,
//! `strftime_now`, a `tojson` that accepts Python's keyword arguments, Python
//! string/dict methods through minijinja-contrib's pycompat).

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::error::{Error, Result};

/// What a template is rendered with, besides the messages.
#[derive(Debug, Default, Clone, Serialize)]
pub struct TemplateTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    pub fn new(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_test("iterable", is_iterable);
        env.add_template_owned(TEMPLATE_NAME.to_string(), source.to_string())
            .map_err(|e| Error::Template(format!("does not compile: {e:#}")))?;
        Ok(ChatTemplate { env })
    }

    /// Renders `messages` (OpenAI-style objects) with optional `tools`.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, None, tokens)
    }

    /// [`Self::render`] with extra template variables (a request's
    /// `chat_template_kwargs`, e.g. `enable_thinking`); the variables the
    /// server sets itself take precedence over them.
    pub fn render_with_kwargs(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Value>,
        tokens: &TemplateTokens,
    ) -> Result<String> {
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::Template(e.to_string()))?;
        let extra = Value::from_serialize(kwargs.unwrap_or(&serde_json::Value::Object(Default::default())));
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => tokens.bos_token.clone().unwrap_or_default(),
            eos_token => tokens.eos_token.clone().unwrap_or_default(),
            pad_token => tokens.pad_token.clone(),
            unk_token => tokens.unk_token.clone(),
            ..extra
        };
        tmpl.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation if e.detail().is_some_and(|d| d.starts_with(RAISED)) => {
                Error::Template(e.detail().unwrap_or_default()[RAISED.len()..].to_string())
            }
            _ => Error::Template(format!("{e:#}")),
        })
    }
}

const RAISED: &str = "raised: ";

/// `x is iterable`, as Python's Jinja decides: `none` is not (templates test
/// `tools is iterable and tools | length > 0` with `tools=None`); an undefined
/// value is (Jinja's Undefined iterates as empty).
fn is_iterable(v: minijinja::Value) -> bool {
    !v.is_none() && (v.is_undefined() || v.try_iter().is_ok())
}

/// `raise_exception(msg)`: the template rejects its input (e.g. roles out of order).
fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{msg}")))
}

/// `strftime_now(fmt)`: the local time formatted with strftime codes.
fn strftime_now(fmt: String) -> String {
    chrono::Local::now().format(&fmt).to_string()
}

/// `tojson`, accepting Python json.dumps' keywords: `indent`, `ensure_ascii`
/// (escapes non-ASCII when true), `sort_keys`, `separators` (ignored beyond the default).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let _sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            let mut out = Vec::new();
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            json.serialize(&mut ser)
                .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            String::from_utf8(out).unwrap_or_default()
        }
        // Python's default separators put a space after ':' and ','.
        None => python_style_compact(&json),
    };
    let text = if ensure_ascii.unwrap_or(false) { escape_non_ascii(&text) } else { text };
    Ok(Value::from_safe_string(text))
}

/// json.dumps(value) with Python's default separators (", ", ": ").
fn python_style_compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Array(items) => {
            format!("[{}]", items.iter().map(python_style_compact).collect::<Vec<_>>().join(", "))
        }
        serde_json::Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", serde_json::Value::String(k.clone()), python_style_compact(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

fn escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tokens() -> TemplateTokens {
        TemplateTokens { bos_token: Some("<s>".into()), eos_token: Some("</s>".into()), ..Default::default() }
    }

    #[test]
    fn renders_a_chatml_template_with_generation_prompt_and_trimmed_blocks() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        )
        .unwrap();
        let msgs = json!([{"role": "system", "content": " be brief "}, {"role": "user", "content": "hi"}]);
        let out = t.render(&msgs, None, true, &tokens()).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&msgs, None, false, &tokens()).unwrap();
        assert!(!out.ends_with("assistant\n"));
    }

    #[test]
    fn bos_eos_loop_controls_and_python_string_methods() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content.upper() }}{% if m.content.startswith('b') %}!{% endif %}{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}{{ eos_token }}",
        )
        .unwrap();
        let msgs = json!([{"role":"system","content":"x"},{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]);
        assert_eq!(t.render(&msgs, None, false, &tokens()).unwrap(), "<s>AB!</s>");
    }

    #[test]
    fn iterable_is_pythons_test_none_is_not_iterable() {
        // Qwen3-Coder's template: without tools, `tools` is none and the length is never taken.
        let t = ChatTemplate::new("{% if tools is iterable and tools | length > 0 %}T{% endif %}{% if nothing is iterable %}U{% endif %}[{{ messages | length }}]").unwrap();
        assert_eq!(t.render(&json!([]), None, false, &tokens()).unwrap(), "U[0]");
        assert_eq!(t.render(&json!([]), Some(&json!([{"type": "function"}])), false, &tokens()).unwrap(), "TU[0]");
    }

    #[test]
    fn raise_exception_becomes_a_template_error_with_the_message() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
        )
        .unwrap();
        let err = t.render(&json!([{"role":"assistant","content":"x"}]), None, false, &tokens()).unwrap_err();
        assert_eq!(err.to_string(), "chat template: Conversation must start with user");
        assert_eq!(t.render(&json!([{"role":"user","content":"x"}]), None, false, &tokens()).unwrap(), "ok");
    }

    #[test]
    fn tojson_matches_python_json_dumps_and_tools_are_passed() {
        let t = ChatTemplate::new("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=True) }}")
            .unwrap();
        let tools = json!([{"name": "get", "parameters": {"a": [1, 2]}}]);
        let out = t.render(&json!([]), Some(&tools), false, &tokens()).unwrap();
        assert_eq!(
            out,
            "[{\"name\": \"get\", \"parameters\": {\"a\": [1, 2]}}]|{\n  \"name\": \"get\",\n  \"parameters\": {\n    \"a\": [\n      1,\n      2\n    ]\n  }\n}|\"\\u00e9\""
        );
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
        let year: i32 = t.render(&json!([]), None, false, &tokens()).unwrap().parse().unwrap();
        assert!(year >= 2026);
    }

    #[test]
    fn syntax_errors_are_reported_at_load() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err().to_string();
        assert!(err.contains("does not compile"), "{err}");
    }
}
