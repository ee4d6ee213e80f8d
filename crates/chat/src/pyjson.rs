//! `tojson` as chat templates expect it: Python's `json.dumps` with `transformers`'
//! defaults (non-ASCII kept, `", "` and `": "` between items and keys, keys in their
//! order), not minijinja's own, which is compact and escapes HTML characters. Tool
//! definitions reach the model through it, so its spacing is part of the prompt.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;

/// The `tojson` filter as transformers defines it, `tojson(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`: `value|tojson`,
/// `value|tojson(indent=2)`, arguments by position in that order or by name.
pub fn tojson(
    value: &Value,
    ensure_ascii: Option<bool>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(usize::try_from(v.clone()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: indent {v} is not a count"),
            )
        })?),
        None => None,
    };
    let ensure_ascii = match ensure_ascii {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = Style {
        indent,
        item,
        key,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// How `json.dumps` was asked to write.
struct Style {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    fn write(&self, value: &Json, depth: usize, out: &mut String) {
        match value {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&python_number(n)),
            Json::String(s) => self.string(s, out),
            Json::Array(items) if items.is_empty() => out.push_str("[]"),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            Json::Object(map) if map.is_empty() => out.push_str("{}"),
            Json::Object(map) => {
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(v, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
        }
    }

    /// What comes before the `i`th item at `depth`.
    fn separate(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item);
        }
        if let Some(indent) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * depth));
        }
    }

    /// What comes before a container's closing bracket at `depth`.
    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                // Python's ensure_ascii escapes all but printable ASCII (DEL too).
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A number as Python's `repr` writes it: integers as they are; floats in the shortest
/// digits that read back the same, positionally where the decimal exponent is in -4..16
/// (with `.0` when whole), otherwise as `1e+16`, `1.5e-07`.
pub(crate) fn python_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let scientific = format!("{f:e}");
    let (mantissa, exp) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if !(-4..16).contains(&exp) {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if exp < 0 {
        format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else {
        let point = exp as usize + 1;
        if digits.len() <= point {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{body}")
}
