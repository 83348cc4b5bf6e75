//! Integers as JSON Schema defines them: a number with a zero fractional part is an integer, so
//! `1500.0` and `1.5e3` are 1500 just as `1500` is. The documents say `type: integer`, and a field
//! that refused `1500.0` would refuse a schema-valid request. The number is read from its JSON text
//! with integer arithmetic only — never through a float — so an amount is exact or refused
//! (`1500.5`, `1e30` and `9007199254740993.0` are refused or exact, never rounded).

use serde::{Deserialize, Deserializer, Serialize, de::Error};
use serde_json::value::RawValue;

/// `deserialize_with` for an `i64` field: any JSON number whose exact value is an integer in i64
/// range.
pub fn integral<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let raw = Box::<RawValue>::deserialize(d)?;
    parse(raw.get()).ok_or_else(|| D::Error::custom(format!("invalid type: {} is not an integer", raw.get())))
}

/// `deserialize_with` for an optional `i64` field (with `#[serde(default)]`): absent is `None`; a
/// present value must be a JSON number whose exact value is an integer in i64 range (`null` too is
/// refused: absent is the only "not given").
pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    integral(d).map(Some)
}

/// The exact integer a JSON number's text denotes, if it is one and fits i64.
pub fn parse(text: &str) -> Option<i64> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (
            &rest[..i],
            rest[i + 1..].trim_start_matches('+').parse::<i64>().ok()?,
        ),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut digits = format!("{int}{frac}");
    let mut scale = exponent.checked_sub(i64::try_from(frac.len()).ok()?)?;
    // A negative scale must only drop zeros, or the number has a fraction.
    while scale < 0 {
        if digits.pop()? != '0' {
            return None;
        }
        scale += 1;
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() + usize::try_from(scale).ok()? > 19 {
        return None;
    }
    let mut value: i128 = digits.parse().ok()?;
    for _ in 0..scale {
        value = value.checked_mul(10)?;
    }
    i64::try_from(if negative { -value } else { value }).ok()
}

/// A JSON value kept as its text, read as an integer by [`JsonInt::get`] — so that a handler can
/// answer a bad value with its own error code rather than a generic body error.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonInt(Box<RawValue>);

impl JsonInt {
    /// The exact integer, if the value is one.
    pub fn get(&self) -> Option<i64> {
        parse(self.0.get())
    }

    /// The raw JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl JsonInt {
    /// A fencing token as a JSON body carries it: an integer (read as [`integral`] reads one, so
    /// `7`, `7.0` and `7e0` are 7) or its decimal text (`"7"`, read as the `X-Fencing-Token`
    /// header is). Anything else, or a value outside 1..=i64::MAX, is `Err` with a message that says
    /// what is wrong, in the caller's words for the field.
    pub fn fencing_token(&self, field: &str) -> Result<crate::FencingToken, String> {
        let text = self.text();
        let shown: String = text.chars().take(40).collect();
        let wrong = || {
            format!("{field} must be an integer in 1..=9223372036854775807 or its decimal text, got {shown}")
        };
        if text.starts_with('"') {
            let decimal: String = serde_json::from_str(text).map_err(|_| wrong())?;
            return decimal.parse().map_err(|e| format!("{field}: {e}"));
        }
        let value = parse(text).ok_or_else(wrong)?;
        crate::FencingToken::new(value).map_err(|_| wrong())
    }
}

impl From<i64> for JsonInt {
    fn from(v: i64) -> Self {
        // The decimal text of an i64 is always a valid JSON number.
        Self(RawValue::from_string(v.to_string()).expect("an i64 is valid JSON"))
    }
}

impl PartialEq for JsonInt {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        #[serde(deserialize_with = "integral")]
        v: i64,
    }

    fn read(json: &str) -> Option<i64> {
        serde_json::from_str::<T>(json).ok().map(|t| t.v)
    }

    #[test]
    fn integral_numbers_are_integers_and_fractions_are_not() {
        assert_eq!(read(r#"{"v": 1500}"#), Some(1500));
        assert_eq!(read(r#"{"v": 1500.0}"#), Some(1500));
        assert_eq!(read(r#"{"v": 1.5e3}"#), Some(1500));
        assert_eq!(read(r#"{"v": 15E+2}"#), Some(1500));
        assert_eq!(read(r#"{"v": -7}"#), Some(-7));
        assert_eq!(read(r#"{"v": 0.0}"#), Some(0));
        assert_eq!(read(r#"{"v": 9223372036854775807}"#), Some(i64::MAX));
        assert_eq!(read(r#"{"v": -9223372036854775808}"#), Some(i64::MIN));
        // Exact, never through a float: 2^53 + 1 stays itself.
        assert_eq!(read(r#"{"v": 9007199254740993.0}"#), Some(9_007_199_254_740_993));
        for bad in [
            r#"{"v": 1500.5}"#,
            r#"{"v": "1500"}"#,
            r#"{"v": 1e19}"#,
            r#"{"v": 9223372036854775808}"#,
            r#"{"v": 15e-1}"#,
            r#"{"v": null}"#,
            r#"{"v": true}"#,
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
    }

    fn token(json: &str) -> Result<i64, String> {
        let v: JsonInt = serde_json::from_str(json).expect("json");
        v.fencing_token("fencingToken").map(crate::FencingToken::get)
    }

    #[test]
    fn a_fencing_token_is_an_exact_integer_or_its_decimal_text() {
        for (json, want) in [
            ("1", 1),
            ("1.0", 1),
            ("1e0", 1),
            ("7E+1", 70),
            ("\"42\"", 42),
            ("\"007\"", 7),
        ] {
            assert_eq!(token(json), Ok(want), "{json}");
        }
        for bad in [
            "0",
            "-1",
            "1.5",
            "0.0",
            "1e19",
            "9223372036854775808",
            "\"1.0\"",
            "\"\"",
            "null",
            "true",
            "{}",
            "[1]",
        ] {
            let e = token(bad).expect_err(bad);
            assert!(e.starts_with("fencingToken"), "{bad}: {e}");
            assert!(!e.contains("untagged"), "{bad}: {e}");
        }
        assert!(token("1.5").unwrap_err().contains("got 1.5"));
    }

    #[test]
    fn a_kept_value_reads_the_same() {
        assert_eq!(JsonInt::from(42).get(), Some(42));
        let v: JsonInt = serde_json::from_str("42.0").expect("json");
        assert_eq!(v.get(), Some(42));
        let v: JsonInt = serde_json::from_str("\"42\"").expect("json");
        assert_eq!(v.get(), None);
    }
}
