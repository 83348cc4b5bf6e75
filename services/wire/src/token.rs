//! Fencing tokens as they cross a process boundary.
//!
//! A token is a strictly positive `i64` (the lockdb sequence is `BIGINT`, starting at 1). A missing,
//! empty, non-numeric, zero, negative or overflowing token is an error: coercing it to 0 would make
//! it compare below every fence and read as a harmless no-op (C3 `INVALID_TOKEN`).

use std::fmt;
use std::str::FromStr;

use http::HeaderMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The header that carries the token to a protected resource.
pub const FENCING_TOKEN_HEADER: &str = "X-Fencing-Token";

/// A fencing token: always > 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the X-Fencing-Token header is missing")]
    Missing,
    #[error("the fencing token is empty")]
    Empty,
    #[error("the fencing token is not a decimal integer: {0:?}")]
    NotNumeric(String),
    #[error("the fencing token must be greater than zero, got {0}")]
    NotPositive(String),
    #[error("the fencing token does not fit a signed 64-bit integer: {0}")]
    Overflow(String),
}

impl FencingToken {
    /// A token from a value read back from the database (where CHECK constraints keep it > 0).
    pub fn new(value: i64) -> Result<Self, TokenError> {
        if value > 0 {
            Ok(Self(value))
        } else {
            Err(TokenError::NotPositive(value.to_string()))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// Reads the token from request headers, strictly.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, TokenError> {
        let value = headers.get(FENCING_TOKEN_HEADER).ok_or(TokenError::Missing)?;
        let text = value
            .to_str()
            .map_err(|_| TokenError::NotNumeric(String::from_utf8_lossy(value.as_bytes()).into()))?;
        text.parse()
    }
}

impl FromStr for FencingToken {
    type Err = TokenError;

    /// Only `[0-9]+` or `-[0-9]+` is a number here: no whitespace, no `+`, no hex, no exponent.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(TokenError::Empty);
        }
        let (negative, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenError::NotNumeric(s.to_owned()));
        }
        if negative {
            return Err(TokenError::NotPositive(s.to_owned()));
        }
        let value: i64 = digits.parse().map_err(|_| TokenError::Overflow(s.to_owned()))?;
        Self::new(value).map_err(|_| TokenError::NotPositive(s.to_owned()))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for FencingToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for FencingToken {
    /// JSON bodies may carry the token as a number or a decimal string; both are checked strictly.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Int(v) => FencingToken::new(v).map_err(serde::de::Error::custom),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Every decimal text [`FencingToken::from_str`] accepts, as a regular expression: optional leading
/// zeros, then 1..=9223372036854775807 (`i64::MAX`, spelled out digit by digit). The OpenAPI
/// documents give it for the `X-Fencing-Token` header, so that they say exactly what is accepted.
pub const DECIMAL_PATTERN: &str = "^0*([1-9][0-9]{0,17}|[1-8][0-9]{18}|9[0-1][0-9]{17}|92[0-1][0-9]{16}|922[0-2][0-9]{15}|9223[0-2][0-9]{14}|92233[0-6][0-9]{13}|922337[0-1][0-9]{12}|92233720[0-2][0-9]{10}|922337203[0-5][0-9]{9}|9223372036[0-7][0-9]{8}|92233720368[0-4][0-9]{7}|922337203685[0-3][0-9]{6}|9223372036854[0-6][0-9]{5}|92233720368547[0-6][0-9]{4}|922337203685477[0-4][0-9]{3}|9223372036854775[0-7][0-9]{2}|922337203685477580[0-6]|9223372036854775807)$";

#[cfg(feature = "openapi")]
impl FencingToken {
    /// The token as the services print it: a JSON integer in 1..=i64::MAX.
    pub fn integer_schema() -> utoipa::openapi::schema::Object {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(i64::MAX))
            .build()
    }

    /// The token as text (a header, or the string form a JSON body may use).
    pub fn text_schema() -> utoipa::openapi::schema::Object {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(DECIMAL_PATTERN))
            .build()
    }

    /// What [`Deserialize`] accepts: the integer or its decimal text.
    pub fn input_schema() -> utoipa::openapi::schema::Schema {
        use utoipa::openapi::schema::OneOfBuilder;
        OneOfBuilder::new()
            .item(Self::integer_schema())
            .item(Self::text_schema())
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for FencingToken {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        Self::integer_schema().into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for FencingToken {
    fn name() -> std::borrow::Cow<'static, str> {
        "FencingToken".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_positive_decimal() {
        assert_eq!("1".parse::<FencingToken>().map(FencingToken::get), Ok(1));
        assert_eq!(
            "9223372036854775807"
                .parse::<FencingToken>()
                .map(FencingToken::get),
            Ok(i64::MAX)
        );
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!("".parse::<FencingToken>(), Err(TokenError::Empty));
        for bad in ["abc", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "-", "١"] {
            assert!(
                matches!(bad.parse::<FencingToken>(), Err(TokenError::NotNumeric(_))),
                "{bad:?}"
            );
        }
        for bad in ["0", "-1", "-9223372036854775808", "000"] {
            assert!(
                matches!(bad.parse::<FencingToken>(), Err(TokenError::NotPositive(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            "9223372036854775808".parse::<FencingToken>(),
            Err(TokenError::Overflow(_))
        ));
    }

    #[test]
    fn header_missing_is_an_error_not_zero() {
        let headers = HeaderMap::new();
        assert_eq!(FencingToken::from_headers(&headers), Err(TokenError::Missing));
    }

    #[test]
    fn json_rejects_zero_and_negative() {
        assert!(serde_json::from_str::<FencingToken>("0").is_err());
        assert!(serde_json::from_str::<FencingToken>("-3").is_err());
        assert!(serde_json::from_str::<FencingToken>("\"x\"").is_err());
        assert_eq!(
            serde_json::from_str::<FencingToken>("\"42\"").ok(),
            FencingToken::new(42).ok()
        );
    }
}
