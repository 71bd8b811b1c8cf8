//! GLM-4.5/4.6/4.7's tool calls (mlx-lm's `glm47` parser), inside `<tool_call>` blocks:
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! </tool_call>
//! ```
//!
//! Values are bare text: a parameter the request's tools type as a string
//! stays text; any other is read as JSON where it parses (Python's `True`,
//! `False` and `None` too, as mlx-lm's literal_eval reads them) and stays
//! text where it does not.

use serde_json::{Map, Value};

use super::qwen_xml::ParamTypes;
use super::tool_calls::ToolCall;

/// The marker of a parameter name: GLM's templates are recognised by it.
pub const ARG_KEY: &str = "<arg_key>";
const ARG_KEY_END: &str = "</arg_key>";
const ARG_VALUE: &str = "<arg_value>";
const ARG_VALUE_END: &str = "</arg_value>";

/// The call in a `<tool_call>` block body, or None when it is not one.
pub fn call(body: &str, types: Option<&ParamTypes>) -> Option<ToolCall> {
    let (name, mut rest) = match body.find(ARG_KEY) {
        Some(at) => (&body[..at], &body[at..]),
        None => (body, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains(['<', '>', '{', '}', '\n']) {
        return None;
    }
    let mut args = Map::new();
    while let Some(at) = rest.find(ARG_KEY) {
        let (key, after) = rest[at + ARG_KEY.len()..].split_once(ARG_KEY_END)?;
        let after = after.trim_start().strip_prefix(ARG_VALUE)?;
        let (text, next) = match after.find(ARG_VALUE_END) {
            Some(end) => (&after[..end], &after[end + ARG_VALUE_END.len()..]),
            None => (after, ""),
        };
        let key = key.trim();
        args.insert(key.to_string(), typed(text, types.and_then(|t| t.of(name, key))));
        rest = next;
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// A value's text as mlx-lm's glm47 parser reads it.
fn typed(text: &str, ty: Option<&str>) -> Value {
    if ty == Some("string") {
        return Value::String(text.to_string());
    }
    match text.trim() {
        "True" => Value::Bool(true),
        "False" => Value::Bool(false),
        "None" => Value::Null,
        t => serde_json::from_str(t).unwrap_or_else(|_| Value::String(text.to_string())),
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
    fn values_are_json_unless_the_tools_say_string() {
        let tools = json!([{"type": "function", "function": {"name": "book", "parameters": {"properties": {
            "city": {"type": "string"}, "code": {"type": "string"}, "nights": {"type": "integer"}}}}}]);
        let types = ParamTypes::from_tools(&tools);
        let body = "book\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>code</arg_key>\n<arg_value>42</arg_value>\n\
                    <arg_key>nights</arg_key>\n<arg_value>3</arg_value>\n<arg_key>pets</arg_key>\n<arg_value>True</arg_value>\n\
                    <arg_key>guests</arg_key>\n<arg_value>[\"a\", \"b\"]</arg_value>\n<arg_key>note</arg_key>\n<arg_value>two words</arg_value>\n";
        let c = call(body, Some(&types)).unwrap();
        assert_eq!(c.name, "book");
        assert_eq!(args(&c), json!({"city": "Paris", "code": "42", "nights": 3, "pets": true, "guests": ["a", "b"], "note": "two words"}));
        // Without the tools, what parses as JSON is JSON.
        assert_eq!(args(&call(body, None).unwrap())["code"], json!(42));
    }

    #[test]
    fn a_body_that_is_no_call_is_none() {
        assert!(call("{\"name\": \"f\"}", None).is_none());
        assert!(call("\n<arg_key>a</arg_key><arg_value>1</arg_value>", None).is_none());
        assert_eq!(args(&call("now\n", None).unwrap()), json!({}));
        // A block cut short still gives what it holds.
        assert_eq!(args(&call("f\n<arg_key>a</arg_key>\n<arg_value>x", None).unwrap()), json!({"a": "x"}));
    }
}
