//! Gemma 4's tool calls: `<|tool_call>call:NAME{ARGS}<tool_call|>`, ARGS an
//! object in Gemma's own literal syntax — bare keys, strings between `<|"|>`
//! delimiters, numbers, `true`/`false`/`null`, nested `{…}` and `[…]` — read
//! into JSON as mlx-lm's gemma4 parser reads it (quoted JSON keys and strings
//! are taken too).

use serde_json::{Map, Number, Value};

use super::tool_calls::ToolCall;

pub const CALL_START: &str = "<|tool_call>";
pub const CALL_END: &str = "<tool_call|>";
/// Gemma 4's string delimiter, on both sides of a string.
pub const QUOTE: &str = "<|\"|>";
/// Gemma 4's reasoning: a `thought` channel.
pub const THOUGHT_START: &str = "<|channel>thought";
pub const THOUGHT_END: &str = "<channel|>";

/// The call in a block body (`call:NAME{…}`, whitespace around allowed); None
/// when it is not one.
pub fn call(body: &str) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("call:")?;
    let open = rest.find('{')?;
    let name = &rest[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.') {
        return None;
    }
    let mut p = Parser { s: &rest[open..] };
    let args = p.object()?;
    if !p.s.trim().is_empty() {
        return None;
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// A recursive-descent reader over the text left to read.
struct Parser<'a> {
    s: &'a str,
}

impl<'a> Parser<'a> {
    fn skip_ws(&mut self) {
        self.s = self.s.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        match self.s.strip_prefix(token) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    fn object(&mut self) -> Option<Map<String, Value>> {
        if !self.eat("{") {
            return None;
        }
        let mut map = Map::new();
        if self.eat("}") {
            return Some(map);
        }
        loop {
            let key = self.key()?;
            if !self.eat(":") {
                return None;
            }
            map.insert(key, self.value()?);
            if self.eat("}") {
                return Some(map);
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn array(&mut self) -> Option<Vec<Value>> {
        if !self.eat("[") {
            return None;
        }
        let mut items = Vec::new();
        if self.eat("]") {
            return Some(items);
        }
        loop {
            items.push(self.value()?);
            if self.eat("]") {
                return Some(items);
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    /// A bare key, or a key in either kind of quotes.
    fn key(&mut self) -> Option<String> {
        self.skip_ws();
        if self.s.starts_with(QUOTE) || self.s.starts_with('"') {
            return match self.value()? {
                Value::String(k) => Some(k),
                _ => None,
            };
        }
        let end = self.s.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-')).unwrap_or(self.s.len());
        if end == 0 {
            return None;
        }
        let key = self.s[..end].to_string();
        self.s = &self.s[end..];
        Some(key)
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_ws();
        if let Some(rest) = self.s.strip_prefix(QUOTE) {
            let end = rest.find(QUOTE)?;
            self.s = &rest[end + QUOTE.len()..];
            return Some(Value::String(rest[..end].to_string()));
        }
        match self.s.chars().next()? {
            '{' => self.object().map(Value::Object),
            '[' => self.array().map(Value::Array),
            '"' => {
                // A JSON string: its extent is what serde's reader takes.
                let mut de = serde_json::Deserializer::from_str(self.s).into_iter::<String>();
                let v = de.next()?.ok()?;
                self.s = &self.s[de.byte_offset()..];
                Some(Value::String(v))
            }
            _ => {
                let end = self.s.find([',', '}', ']']).unwrap_or(self.s.len());
                let word = self.s[..end].trim();
                self.s = &self.s[end..];
                match word {
                    "true" => Some(Value::Bool(true)),
                    "false" => Some(Value::Bool(false)),
                    "null" => Some(Value::Null),
                    _ => serde_json::from_str::<Number>(word).ok().map(Value::Number),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(body: &str) -> Option<(String, Value)> {
        call(body).map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap()))
    }

    #[test]
    fn gemma_literals_read_as_json() {
        let body = r#"call:get_weather{city:<|"|>Paris, "FR" {x}<|"|>,days:3,metric:true,extra:null,tags:[<|"|>a<|"|>,2.5],opts:{deep:{n:-1}}}"#;
        let (name, v) = args(body).unwrap();
        assert_eq!(name, "get_weather");
        assert_eq!(
            v,
            serde_json::json!({"city": "Paris, \"FR\" {x}", "days": 3, "metric": true, "extra": null,
                               "tags": ["a", 2.5], "opts": {"deep": {"n": -1}}})
        );
        assert_eq!(args(" call:ping{} ").unwrap(), ("ping".into(), serde_json::json!({})));
        // JSON spelling inside is taken too (mlx-lm's reader leaves it alone).
        assert_eq!(args(r#"call:f{"k":"v",n:1}"#).unwrap().1, serde_json::json!({"k": "v", "n": 1}));
    }

    #[test]
    fn what_is_not_one_call_is_refused() {
        for bad in ["get{a:1}", "call:{a:1}", "call:f{a:1", "call:f{a:<|\"|>open}", "call:f{a:1} trailing", "call:f{a:nope}", "call:f{:1}"] {
            assert!(call(bad).is_none(), "{bad}");
        }
    }
}
