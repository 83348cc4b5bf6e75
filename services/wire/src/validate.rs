//! Bounds on the inputs the lock service accepts. Rejections say what was wrong; nothing is clamped.
//! lock-server answers an [`Invalid`] with a 400 carrying its code; `dlock-client` refuses the same
//! input before sending it.

/// A refused input: a machine-readable `code` (`INVALID_LOCK_KEY`, `INVALID_OWNER_ID`,
/// `INVALID_TTL`) and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

impl Invalid {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Longest accepted lock key, in characters (as JSON Schema counts `maxLength`, so that the OpenAPI
/// documents can state the bound exactly).
pub const MAX_KEY_LEN: usize = 256;
/// Longest accepted owner id, in characters.
pub const MAX_OWNER_LEN: usize = 128;
/// TTL bounds in milliseconds: at least 10 ms (tests use short leases), at most one day.
pub const MIN_TTL_MS: i64 = 10;
pub const MAX_TTL_MS: i64 = 86_400_000;

fn printable(s: &str) -> bool {
    s.chars()
        .all(|c| !c.is_control() && !c.is_whitespace() || c == ' ')
        && !s.starts_with(' ')
        && !s.ends_with(' ')
}

/// A lock key: non-empty, at most [`MAX_KEY_LEN`] characters, printable, no leading/trailing space.
pub fn lock_key(key: &str) -> Result<(), Invalid> {
    if key.is_empty() {
        return Err(Invalid::new("INVALID_LOCK_KEY", "the lock key is empty"));
    }
    let chars = key.chars().count();
    if chars > MAX_KEY_LEN {
        return Err(Invalid::new(
            "INVALID_LOCK_KEY",
            format!("the lock key is {chars} characters long; at most {MAX_KEY_LEN} are allowed"),
        ));
    }
    if !printable(key) {
        return Err(Invalid::new(
            "INVALID_LOCK_KEY",
            "the lock key must be printable characters without control characters or surrounding spaces",
        ));
    }
    Ok(())
}

/// An owner id: the same shape as a key, shorter.
pub fn owner_id(owner: &str) -> Result<(), Invalid> {
    if owner.is_empty() || owner.chars().count() > MAX_OWNER_LEN || !printable(owner) {
        return Err(Invalid::new(
            "INVALID_OWNER_ID",
            format!(
                "the owner id must be 1..={MAX_OWNER_LEN} printable characters without surrounding spaces"
            ),
        ));
    }
    Ok(())
}

/// A TTL in milliseconds within [`MIN_TTL_MS`]..=[`MAX_TTL_MS`]; returns seconds for `make_interval`.
pub fn ttl_ms(field: &str, ttl_ms: i64) -> Result<f64, Invalid> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(Invalid::new(
            "INVALID_TTL",
            format!("{field} must be between {MIN_TTL_MS} and {MAX_TTL_MS} milliseconds, got {ttl_ms}"),
        ));
    }
    // Exact for every value in range: milliseconds / 1000 as a double is what make_interval(secs =>) takes.
    Ok(ttl_ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert!(lock_key("account:7f1c").is_ok());
        assert!(lock_key("a b").is_ok());
        assert!(lock_key("").is_err());
        assert!(lock_key(" a").is_err());
        assert!(lock_key("a\nb").is_err());
        assert!(lock_key("a\u{0}b").is_err());
        assert!(lock_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(lock_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
    }

    #[test]
    fn ttls() {
        assert!(ttl_ms("ttlMs", 0).is_err());
        assert!(ttl_ms("ttlMs", -5).is_err());
        assert!(ttl_ms("ttlMs", i64::MAX).is_err());
        assert_eq!(ttl_ms("ttlMs", 1500).ok(), Some(1.5));
    }
}
