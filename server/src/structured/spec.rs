//! What a request's output must be, as a Lark grammar for llguidance: JSON of
//! a schema, or tool calls in the model family's format, after the reasoning
//! block when the template thinks.

use serde_json::{json, Value};

use crate::tokenizer::gemma4;
use crate::tokenizer::reasoning::ThinkMarkers;
use crate::tokenizer::tool_calls::{ToolCallFormat, HERMES_END, HERMES_START, MISTRAL_CALLS};

/// One callable function: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSchema {
    pub name: String,
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A JSON value of this schema (`response_format`).
    Json(Value),
    /// Calls of these functions, written as `format` writes them (`tool_choice`
    /// `required` or a named function); one call unless `parallel`.
    Calls { format: ToolCallFormat, functions: Vec<CallSchema>, parallel: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub struct GuideSpec {
    pub output: Output,
    /// Some(whether the output starts inside a reasoning block) when the
    /// template thinks: the block is free text, the constraint starts after it.
    pub thinking: Option<bool>,
    /// How the model's reasoning block opens and closes.
    pub markers: ThinkMarkers,
}

/// How constrained JSON is written: one line, with the separators of Python's
/// `json.dumps` (what models saw most), no free whitespace (which an unsure
/// model could emit forever).
fn with_layout(schema: &Value) -> Value {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        // `true` / `{}`: any JSON value.
        Value::Bool(true) => json!({}),
        other => other.clone(),
    };
    if let Value::Object(fields) = &mut schema {
        fields.entry("x-guidance").or_insert(json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// `%json {schema}`: a nested JSON grammar.
fn json_rule(schema: &Value) -> String {
    format!("%json {}", with_layout(schema))
}

/// The schema of one call written as `{"name": .., <args_key>: {..}}`.
fn call_schema(functions: &[CallSchema], args_key: &str) -> Value {
    let one = |f: &CallSchema| {
        json!({
            "type": "object",
            "properties": {"name": {"const": f.name}, args_key: f.parameters},
            "required": ["name", args_key],
            "additionalProperties": false,
        })
    };
    match functions {
        [f] => one(f),
        _ => json!({"anyOf": functions.iter().map(one).collect::<Vec<_>>()}),
    }
}

/// How a format writes a call whose parameter values are bare text between
/// tags (Qwen XML, GLM): the text before and after a function's parameters,
/// before a parameter's value, and the tag that ends a value.
struct TaggedCall {
    head: fn(&str) -> String,
    tail: &'static str,
    param: fn(&str) -> String,
    value_end: &'static str,
}

/// Qwen XML: `<function=NAME>`, then each `<parameter=P>` and its value on
/// lines of their own, then `</function>`.
const QWEN_XML_CALL: TaggedCall = TaggedCall {
    head: |name| format!("<function={name}>\n"),
    tail: "</function>",
    param: |p| format!("<parameter={p}>\n"),
    value_end: "\n</parameter>\n",
};

/// GLM: the function's name on its line, then
/// `<arg_key>P</arg_key>\n<arg_value>V</arg_value>\n` per parameter.
const GLM_CALL: TaggedCall = TaggedCall {
    head: |name| format!("{name}\n"),
    tail: "",
    param: |p| format!("<arg_key>{p}</arg_key>\n<arg_value>"),
    value_end: "</arg_value>\n",
};

/// Calls in a [`TaggedCall`] format: per function a rule of its parameters
/// in the schema's order (the required ones always, the others optionally),
/// values as JSON of the property's schema for typed ones, free text (up to
/// the closing tag) for strings and untyped ones. Returns the alternatives
/// of the call's body.
fn tagged_functions(functions: &[CallSchema], shape: &TaggedCall, rules: &mut Vec<String>) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut names = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let required: Vec<&str> = f.parameters["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let mut params = Vec::new();
        for (j, (p, schema)) in f.parameters["properties"].as_object().into_iter().flatten().enumerate() {
            let value = match schema.get("type").and_then(Value::as_str) {
                Some("integer" | "number" | "boolean" | "object" | "array") => format!("{} {}", json_rule(schema), q(shape.value_end)),
                _ => {
                    rules.push(format!("v{i}_{j}[suffix={}]: {}", q(shape.value_end), text_value(schema)));
                    format!("v{i}_{j}")
                }
            };
            rules.push(format!("p{i}_{j}: {} {value}", q(&(shape.param)(p))));
            params.push(if required.contains(&p.as_str()) { format!("p{i}_{j}") } else { format!("p{i}_{j}?") });
        }
        let tail = if shape.tail.is_empty() { String::new() } else { q(shape.tail) };
        rules.push(format!("f{i}: {} {} {tail}", q(&(shape.head)(&f.name)), params.join(" ")));
        names.push(format!("f{i}"));
    }
    names.join(" | ")
}

/// Gemma 4 calls: per function a rule `call:NAME{` then its arguments in
/// Gemma's literal syntax, the required ones first in the schema's order, then
/// the others optionally (keys bare; strings between `<|"|>` delimiters as free
/// text, other values as JSON of their schema), `}` to close. Returns the
/// alternatives of the block's body.
fn gemma4_functions(functions: &[CallSchema], literal: &impl Fn(&str) -> String, rules: &mut Vec<String>) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let quote = literal(gemma4::QUOTE);
    let mut names = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let required: Vec<&str> = f.parameters["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        for (j, (p, schema)) in f.parameters["properties"].as_object().into_iter().flatten().enumerate() {
            let value = match schema.get("type").and_then(Value::as_str) {
                Some("integer" | "number" | "boolean" | "object" | "array") => json_rule(schema),
                _ => {
                    rules.push(format!("g{i}_{j}[suffix={quote}]: {}", text_value(schema)));
                    format!("{quote} g{i}_{j}")
                }
            };
            rules.push(format!("a{i}_{j}: {} {value}", q(&format!("{p}:"))));
            if required.contains(&p.as_str()) { req.push(format!("a{i}_{j}")) } else { opt.push(format!("a{i}_{j}")) }
        }
        let args = if !req.is_empty() {
            let mut s = req.join(r#" "," "#);
            for o in &opt {
                s.push_str(&format!(r#" ("," {o})?"#));
            }
            s
        } else if !opt.is_empty() {
            format!(r#"(({0}) ("," ({0}))*)?"#, opt.join(" | "))
        } else {
            String::new()
        };
        rules.push(format!(r#"h{i}: {} {args} "}}""#, q(&format!("call:{}{{", f.name))));
        names.push(format!("h{i}"));
    }
    names.join(" | ")
}

/// A string parameter's bare text as a Lark item: one of its `enum` (or its
/// `const`), or any text within its `minLength`/`maxLength`. (`pattern` and
/// `format` are not enforced on bare text.)
fn text_value(schema: &Value) -> String {
    let words: Vec<String> = match (schema.get("const"), schema.get("enum")) {
        (Some(Value::String(c)), _) => vec![c.clone()],
        (_, Some(Value::Array(e))) => e.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => Vec::new(),
    };
    if !words.is_empty() {
        // Each word literally: regex metacharacters (and Lark's `/`) escaped.
        let escape = |w: &str| w.chars().flat_map(|c| if "\\.+*?()|[]{}^$#&-~/".contains(c) { vec!['\\', c] } else { vec![c] }).collect::<String>();
        return format!("/(?:{})/", words.iter().map(|w| escape(w)).collect::<Vec<_>>().join("|"));
    }
    let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
    match (bound("minLength"), bound("maxLength")) {
        (None, None) => "/(?s:.*)/".to_string(),
        (min, max) => format!("/(?s:.{{{},{}}})/", min.unwrap_or(0), max.map(|m| m.to_string()).unwrap_or_default()),
    }
}

impl GuideSpec {
    /// The grammar; `literal` writes a marker string as a Lark item (a special
    /// token's reference, or a quoted string).
    pub fn lark(&self, literal: impl Fn(&str) -> String) -> String {
        let mut rules = Vec::new();
        let body = match &self.output {
            Output::Json(schema) => json_rule(schema),
            Output::Calls { format, functions, parallel } => {
                let (call, sep) = match format {
                    ToolCallFormat::Hermes => {
                        let call = format!(r#"{} "\n" {} "\n" {}"#, literal(HERMES_START), json_rule(&call_schema(functions, "arguments")), literal(HERMES_END));
                        (call, r#""\n""#)
                    }
                    ToolCallFormat::Llama3Json => (json_rule(&call_schema(functions, "parameters")), r#""; ""#),
                    ToolCallFormat::QwenXml => {
                        let choices = tagged_functions(functions, &QWEN_XML_CALL, &mut rules);
                        (format!(r#"{} "\n" ({choices}) "\n" {}"#, literal(HERMES_START), literal(HERMES_END)), r#""\n""#)
                    }
                    ToolCallFormat::Glm47 => {
                        let choices = tagged_functions(functions, &GLM_CALL, &mut rules);
                        (format!("{} ({choices}) {}", literal(HERMES_START), literal(HERMES_END)), r#""\n""#)
                    }
                    ToolCallFormat::Gemma4 => {
                        let choices = gemma4_functions(functions, &literal, &mut rules);
                        (format!("{} ({choices}) {}", literal(gemma4::CALL_START), literal(gemma4::CALL_END)), "")
                    }
                    ToolCallFormat::Mistral => {
                        let mut list = json!({"type": "array", "items": call_schema(functions, "arguments"), "minItems": 1});
                        if !parallel {
                            list["maxItems"] = json!(1);
                        }
                        (format!("{} {}", literal(MISTRAL_CALLS), json_rule(&list)), "")
                    }
                };
                rules.push(format!("call: {call}"));
                match (*parallel, *format, sep) {
                    // Gemma 4's blocks follow one another directly.
                    (true, ToolCallFormat::Gemma4, _) => "call+".to_string(),
                    (true, _, sep) if !sep.is_empty() => format!("call ({sep} call)*"),
                    _ => "call".to_string(),
                }
            }
        };
        let start = match self.thinking {
            None => body,
            Some(true) => format!("think {body}"),
            Some(false) => format!("({} think)? {body}", literal(self.markers.start)),
        };
        if self.thinking.is_some() {
            rules.push(format!("think: think_text WS?\nthink_text[suffix={}]: /(?s:.*)/\nWS: /[ \\t\\r\\n]+/", literal(self.markers.end)));
        }
        rules.insert(0, format!("start: {start}"));
        rules.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::reasoning::THINK_TAGS;

    fn quoted(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    #[test]
    fn json_output_is_one_nested_json_rule_with_fixed_separators() {
        let spec = GuideSpec { output: Output::Json(json!({"type": "object"})), thinking: None, markers: THINK_TAGS };
        let g = spec.lark(quoted);
        assert!(g.starts_with("start: %json {\"type\":\"object\",\"x-guidance\":{"), "{g}");
        assert!(g.contains("\"key_separator\":\": \""), "{g}");
    }

    #[test]
    fn calls_follow_the_format_and_thinking_comes_first() {
        let f = vec![CallSchema { name: "get".into(), parameters: json!({"type": "object"}) }];
        let spec = GuideSpec { output: Output::Calls { format: ToolCallFormat::Hermes, functions: f.clone(), parallel: true }, thinking: Some(false), markers: THINK_TAGS };
        let g = spec.lark(quoted);
        assert!(g.starts_with("start: (\"<think>\" think)? call (\"\\n\" call)*\ncall: \"<tool_call>\" \"\\n\" %json "), "{g}");
        assert!(g.contains("think_text[suffix=\"</think>\"]"), "{g}");
        let one = GuideSpec { output: Output::Calls { format: ToolCallFormat::Mistral, functions: f, parallel: false }, thinking: None, markers: THINK_TAGS };
        let g = one.lark(|s| if s == MISTRAL_CALLS { "<[5]>".into() } else { quoted(s) });
        assert!(g.starts_with("start: call\ncall: <[5]> %json {\"type\":\"array\""), "{g}");
        assert!(g.contains("\"maxItems\":1"), "{g}");
    }
}
