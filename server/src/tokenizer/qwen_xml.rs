//! Qwen3-Coder's (and Qwen3.5's) XML tool calls, inside `<tool_call>` blocks:
//!
//! ```text
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! ```
//!
//! Values are bare text, so their JSON type comes from the request's tools: a
//! parameter the schema calls an integer, number, boolean, object or array is
//! parsed as one (and stays a string where it does not parse); strings, and
//! parameters the schema does not name, stay strings (as vLLM's qwen3_coder
//! parser reads them).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::tool_calls::ToolCall;

pub const FUNCTION_START: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER_START: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// The JSON type of each function's parameters, from the request's `tools`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamTypes(HashMap<String, HashMap<String, String>>);

impl ParamTypes {
    /// Reads OpenAI `tools` (`[{"type": "function", "function": {"name",
    /// "parameters": {"properties": {..}}}}]`); a type given as a list counts
    /// as its first non-null entry.
    pub fn from_tools(tools: &Value) -> ParamTypes {
        let mut out = HashMap::new();
        for tool in tools.as_array().into_iter().flatten() {
            let f = tool.get("function").unwrap_or(tool);
            let Some(name) = f.get("name").and_then(Value::as_str) else { continue };
            let props = f.pointer("/parameters/properties").and_then(Value::as_object);
            let types = props
                .into_iter()
                .flatten()
                .filter_map(|(p, schema)| {
                    let t = match schema.get("type")? {
                        Value::String(t) => t.clone(),
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null")?.to_string(),
                        _ => return None,
                    };
                    Some((p.clone(), t))
                })
                .collect();
            out.insert(name.to_string(), types);
        }
        ParamTypes(out)
    }

    pub(crate) fn of(&self, function: &str, parameter: &str) -> Option<&str> {
        self.0.get(function)?.get(parameter).map(String::as_str)
    }
}

/// The call in a `<tool_call>` block body, or None when it is not one.
pub fn call(body: &str, types: Option<&ParamTypes>) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix(FUNCTION_START)?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() || name.contains(['<', '\n']) {
        return None;
    }
    rest = rest.trim_end();
    rest = rest.strip_suffix(FUNCTION_END).unwrap_or(rest);
    let mut args = Map::new();
    while let Some(at) = rest.find(PARAMETER_START) {
        let (param, after) = rest[at + PARAMETER_START.len()..].split_once('>')?;
        let (text, next) = match after.find(PARAMETER_END) {
            Some(end) => (&after[..end], &after[end + PARAMETER_END.len()..]),
            None => (after, ""),
        };
        // The value sits on its own lines: one newline each side is layout.
        let text = text.strip_prefix('\n').unwrap_or(text);
        let text = text.strip_suffix('\n').unwrap_or(text);
        let param = param.trim();
        args.insert(param.to_string(), typed(text, types.and_then(|t| t.of(name, param))));
        rest = next;
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// A parameter's text as the JSON value its schema type says.
fn typed(text: &str, ty: Option<&str>) -> Value {
    let string = || Value::String(text.to_string());
    let t = text.trim();
    match ty {
        Some("integer" | "number") => serde_json::from_str::<serde_json::Number>(t).map(Value::Number).unwrap_or_else(|_| string()),
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => string(),
        },
        Some("object" | "array") => serde_json::from_str(t).unwrap_or_else(|_| string()),
        Some("null") if t == "null" => Value::Null,
        _ => string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(c: &ToolCall) -> Value {
        serde_json::from_str(&c.arguments).unwrap()
    }

    #[test]
    fn values_take_the_types_the_tools_give_them() {
        let tools = json!([{"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "nights": {"type": "integer"}, "price": {"type": "number"},
            "pets": {"type": "boolean"}, "guests": {"type": "array"}, "room": {"type": ["object", "null"]}, "code": {"type": "string"}}}}}]);
        let types = ParamTypes::from_tools(&tools);
        let body = "\n<function=book>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=nights>\n3\n</parameter>\n\
                    <parameter=price>\n99.5\n</parameter>\n<parameter=pets>\nTrue\n</parameter>\n<parameter=guests>\n[\"a\", \"b\"]\n</parameter>\n\
                    <parameter=room>\n{\"view\": \"sea\"}\n</parameter>\n<parameter=code>\n007\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n</function>\n";
        let c = call(body, Some(&types)).unwrap();
        assert_eq!(c.name, "book");
        assert_eq!(
            args(&c),
            json!({"city": "San Francisco", "nights": 3, "price": 99.5, "pets": true, "guests": ["a", "b"],
                   "room": {"view": "sea"}, "code": "007", "note": "line one\nline two"})
        );
        // Without the tools every value is a string; a value that does not parse as its type stays one.
        assert_eq!(args(&call(body, None).unwrap())["nights"], json!("3"));
        let c = call("<function=book>\n<parameter=nights>\nthree\n</parameter>\n</function>", Some(&types)).unwrap();
        assert_eq!(args(&c), json!({"nights": "three"}));
    }

    #[test]
    fn a_body_that_is_no_function_is_no_call() {
        assert!(call("{\"name\": \"f\"}", None).is_none());
        assert!(call("<function=>\n</function>", None).is_none());
        // No parameters; a block cut short still gives what it holds.
        assert_eq!(args(&call("<function=now>\n</function>", None).unwrap()), json!({}));
        assert_eq!(args(&call("<function=f>\n<parameter=a>\nx", None).unwrap()), json!({"a": "x"}));
    }
}
