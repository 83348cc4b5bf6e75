//! Turning request bodies and headers into validated values. Every rejection is a 4xx `ApiError`
//! with a machine-readable code, and happens before anything is recorded.

use axum::http::{HeaderMap, StatusCode};
use dlock_common::ApiError;
use dlock_wire::int::JsonInt;
use serde_json::Value;
use uuid::Uuid;

use crate::config::{MAX_LATENCY_MS, Mode};
use crate::ledger::{Behaviour, PaymentRequest};

/// Longest accepted idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 200;

/// Test-mode header choosing the outcome of this request (`ack|reject|timeout`).
pub const OUTCOME_HEADER: &str = "X-Rail-Stub-Outcome";
/// Test-mode header adding latency to this request, in milliseconds.
pub const LATENCY_HEADER: &str = "X-Rail-Stub-Latency-Ms";

/// `POST /v1/payments` and `PUT /v1/admin/behaviour` as sent (dlock_wire::stub: raw values where
/// each bad one gets its own code).
pub use dlock_wire::stub::{BehaviourRequest as BehaviourBody, PaymentOrder as PaymentBody};

pub fn test_mode_disabled() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "TEST_MODE_DISABLED",
        "this control is only available when the rail stub runs with --test-mode",
    )
}

pub fn idempotency_key(key: &str) -> Result<(), ApiError> {
    let chars = key.chars().count();
    if chars == 0 || chars > MAX_IDEMPOTENCY_KEY_CHARS || key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "INVALID_IDEMPOTENCY_KEY",
            format!("the idempotency key must be 1..={MAX_IDEMPOTENCY_KEY_CHARS} printable characters"),
        ));
    }
    Ok(())
}

fn uuid(code: &'static str, field: &str, text: &str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(text).map_err(|_| ApiError::bad_request(code, format!("{field} must be a UUID")))
}

fn currency(text: &str) -> Result<(), ApiError> {
    if text.len() == 3 && text.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "INVALID_CURRENCY",
            "currency must be three upper-case letters (ISO 4217)",
        ))
    }
}

/// Minor units: a JSON integer (its exact value, as JSON Schema reads `type: integer`, so `5.0` is 5)
/// that fits i64 and is > 0. Read from the JSON text with integer arithmetic: never a float.
fn amount(value: &JsonInt) -> Result<i64, ApiError> {
    match value.get() {
        Some(v) if v > 0 => Ok(v),
        _ => Err(ApiError::bad_request(
            "INVALID_AMOUNT",
            "amountMinor must be an integer number of minor units greater than zero",
        )),
    }
}

fn latency(value: &Value) -> Result<u64, ApiError> {
    match value.as_u64() {
        Some(v) if v <= MAX_LATENCY_MS => Ok(v),
        _ => Err(ApiError::bad_request(
            "INVALID_LATENCY",
            format!("latency must be an integer number of milliseconds in 0..={MAX_LATENCY_MS}"),
        )),
    }
}

pub fn payment(body: PaymentBody) -> Result<PaymentRequest, ApiError> {
    idempotency_key(&body.idempotency_key)?;
    let payout_id = uuid("INVALID_PAYOUT_ID", "payoutId", &body.payout_id)?;
    let account_id = uuid("INVALID_ACCOUNT_ID", "accountId", &body.account_id)?;
    let amount_minor = amount(&body.amount_minor)?;
    currency(&body.currency)?;
    Ok(PaymentRequest {
        idempotency_key: body.idempotency_key,
        payout_id,
        account_id,
        amount_minor,
        currency: body.currency,
    })
}

pub fn behaviour(body: BehaviourBody) -> Result<Behaviour, ApiError> {
    let mode = Mode::parse(&body.mode)
        .ok_or_else(|| ApiError::bad_request("INVALID_MODE", "mode must be one of ack, reject, timeout"))?;
    Ok(Behaviour {
        mode,
        latency_ms: latency(&body.latency_ms)?,
    })
}

/// Per-request overrides from the test-mode headers. Outside test mode their presence is a 403, so
/// that a test that relies on them cannot pass by accident against a production-mode stub.
pub fn overrides(headers: &HeaderMap, test_mode: bool) -> Result<(Option<Mode>, Option<u64>), ApiError> {
    let outcome = headers.get(OUTCOME_HEADER);
    let latency_header = headers.get(LATENCY_HEADER);
    if (outcome.is_some() || latency_header.is_some()) && !test_mode {
        return Err(test_mode_disabled());
    }
    let outcome = match outcome {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(Mode::parse).ok_or_else(|| {
            ApiError::bad_request(
                "INVALID_OUTCOME",
                format!("{OUTCOME_HEADER} must be one of ack, reject, timeout"),
            )
        })?),
    };
    let latency_ms = match latency_header {
        None => None,
        Some(v) => {
            let text = v.to_str().unwrap_or("");
            let parsed = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
                text.parse::<u64>().ok()
            } else {
                None
            };
            match parsed {
                Some(ms) if ms <= MAX_LATENCY_MS => Some(ms),
                _ => {
                    return Err(ApiError::bad_request(
                        "INVALID_LATENCY",
                        format!(
                            "{LATENCY_HEADER} must be a whole number of milliseconds in 0..={MAX_LATENCY_MS}"
                        ),
                    ));
                }
            }
        }
    };
    Ok((outcome, latency_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(amount: Value, currency: &str) -> PaymentBody {
        PaymentBody {
            idempotency_key: "k".into(),
            payout_id: Uuid::new_v4().to_string(),
            account_id: Uuid::new_v4().to_string(),
            amount_minor: serde_json::from_str(&amount.to_string()).expect("a JSON value"),
            currency: currency.into(),
        }
    }

    fn code(r: Result<PaymentRequest, ApiError>) -> &'static str {
        r.err().map(|e| e.code).unwrap_or("OK")
    }

    #[test]
    fn amounts_are_positive_integers_only() {
        assert_eq!(code(payment(body(json!(1), "EUR"))), "OK");
        assert_eq!(code(payment(body(json!(i64::MAX), "EUR"))), "OK");
        // JSON Schema's `type: integer` (the document's) holds 1.0: it is the integer 1, read
        // exactly from its text, never through a float.
        assert_eq!(code(payment(body(json!(1.0), "EUR"))), "OK");
        for bad in [
            json!(0),
            json!(-1),
            json!(1.5),
            json!(0.0),
            json!("5"),
            json!(u64::MAX),
            json!(null),
        ] {
            assert_eq!(code(payment(body(bad.clone(), "EUR"))), "INVALID_AMOUNT", "{bad}");
        }
    }

    #[test]
    fn currencies_are_three_upper_case_letters() {
        for bad in ["eur", "EU", "EURO", "E1R", "", "ÉUR"] {
            assert_eq!(code(payment(body(json!(1), bad))), "INVALID_CURRENCY", "{bad}");
        }
    }

    #[test]
    fn keys_are_bounded_and_printable() {
        assert!(idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_CHARS)).is_ok());
        assert!(idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_CHARS + 1)).is_err());
        assert!(idempotency_key("").is_err());
        assert!(idempotency_key("a\nb").is_err());
        assert!(idempotency_key("payout/42 é").is_ok());
    }

    #[test]
    fn headers_need_test_mode() {
        let mut h = HeaderMap::new();
        h.insert(OUTCOME_HEADER, "reject".parse().unwrap());
        assert_eq!(
            overrides(&h, false).err().map(|e| e.status),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(overrides(&h, true).ok(), Some((Some(Mode::Reject), None)));
        h.insert(LATENCY_HEADER, "-5".parse().unwrap());
        assert_eq!(overrides(&h, true).err().map(|e| e.code), Some("INVALID_LATENCY"));
    }
}
