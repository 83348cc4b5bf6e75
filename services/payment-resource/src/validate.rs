//! Bounds on request values. Each failure is a [`PaymentError::Invalid`] with its own code; nothing is
//! clamped or coerced.

use crate::error::PaymentError;

/// Longest accepted idempotency key, in characters (JSON Schema `maxLength` counts characters).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// ISO-4217 shape, as `account_currency_ck`: exactly three ASCII capitals.
pub fn currency(value: &str) -> Result<(), PaymentError> {
    if value.len() == 3 && value.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(PaymentError::invalid(
            "INVALID_CURRENCY",
            format!("currency must match ^[A-Z]{{3}}$, got {value:?}"),
        ))
    }
}

/// A payout amount: strictly positive minor units.
pub fn amount(field: &str, value: i64) -> Result<(), PaymentError> {
    if value > 0 {
        Ok(())
    } else {
        Err(PaymentError::invalid(
            "INVALID_AMOUNT",
            format!("{field} must be a positive integer of minor units, got {value}"),
        ))
    }
}

/// An opening balance: zero or more minor units.
pub fn opening_balance(value: i64) -> Result<(), PaymentError> {
    if value >= 0 {
        Ok(())
    } else {
        Err(PaymentError::invalid(
            "INVALID_AMOUNT",
            format!("openingBalanceMinor must be zero or more minor units, got {value}"),
        ))
    }
}

/// 1..=128 printable characters, no surrounding spaces.
pub fn idempotency_key(key: &str) -> Result<(), PaymentError> {
    let printable = key.chars().all(|c| !c.is_control()) && key.trim() == key;
    if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_LEN || !printable {
        return Err(PaymentError::invalid(
            "INVALID_IDEMPOTENCY_KEY",
            format!(
                "idempotencyKey must be 1..={MAX_IDEMPOTENCY_KEY_LEN} printable characters without surrounding spaces"
            ),
        ));
    }
    Ok(())
}

/// Longest accepted failure reason, in bytes.
pub const MAX_REASON_LEN: usize = 64;

/// A failure reason is a machine-readable code: `^[A-Z][A-Z0-9_]*$`, at most 64 bytes.
pub fn reason(value: &str) -> Result<(), PaymentError> {
    let ok = value.len() <= MAX_REASON_LEN
        && value.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && value
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(PaymentError::invalid(
            "INVALID_REASON",
            format!("reason must match ^[A-Z][A-Z0-9_]*$ and be at most {MAX_REASON_LEN} bytes"),
        ))
    }
}

/// Owner ids follow the lock service's rule (the owner that holds the grant).
pub fn owner_id(owner: &str) -> Result<(), PaymentError> {
    dlock_common::validate::owner_id(owner).map_err(|e| PaymentError::invalid(e.code, e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn currencies() {
        assert!(currency("EUR").is_ok());
        for bad in ["", "eur", "EU", "EURO", "E1R", "ÉUR", " EU"] {
            assert!(currency(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn amounts() {
        assert!(amount("amountMinor", 1).is_ok());
        assert!(amount("amountMinor", i64::MAX).is_ok());
        assert!(amount("amountMinor", 0).is_err());
        assert!(amount("amountMinor", -1).is_err());
        assert!(opening_balance(0).is_ok());
        assert!(opening_balance(-1).is_err());
    }

    #[test]
    fn reasons() {
        assert!(reason("RAIL_REJECTED").is_ok());
        for bad in ["", "rail", "_X", "A-B", "A B", &"A".repeat(MAX_REASON_LEN + 1)] {
            assert!(reason(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys() {
        assert!(idempotency_key("k-1").is_ok());
        assert!(idempotency_key("").is_err());
        assert!(idempotency_key(" k").is_err());
        assert!(idempotency_key("a\nb").is_err());
        assert!(idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_LEN + 1)).is_err());
    }
}
