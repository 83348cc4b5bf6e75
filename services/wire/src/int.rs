//! Integers as JSON Schema defines them: a number with a zero fractional part is an integer, so
//! `1500.0` and `1.5e3` are the TTL 1500 just as `1500` is. The documents say `type: integer`, and a
//! field that refused `1500.0` would refuse a schema-valid request. Money is not read this way:
//! amounts stay JSON integers only (no float ever near money).

use serde::{Deserialize, Deserializer, de::Error};

/// `deserialize_with` for an `i64` field: any JSON number that is exactly an integer in i64 range.
pub fn integral<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    if let Some(v) = n.as_i64() {
        return Ok(v);
    }
    match n.as_f64() {
        // 2^63 is exactly representable; every f64 below it with no fraction converts exactly.
        Some(f) if f.fract() == 0.0 && f >= -9_223_372_036_854_775_808.0 && f < 9_223_372_036_854_775_808.0 => {
            Ok(f as i64)
        }
        _ => Err(D::Error::custom(format!("invalid type: {n} is not an integer"))),
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
        assert_eq!(read(r#"{"v": -7}"#), Some(-7));
        assert_eq!(read(r#"{"v": 1500.5}"#), None);
        assert_eq!(read(r#"{"v": "1500"}"#), None);
        assert_eq!(read(r#"{"v": 1e19}"#), None);
        assert_eq!(read(r#"{"v": null}"#), None);
    }
}
