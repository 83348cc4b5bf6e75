//! Regular expressions (ECMA-262 / Python `re` syntax, which the OpenAPI tools use) that state the
//! validators' rules in the documents. Tests in this module run each one against the validator it
//! mirrors.

/// `crate::validate::lock_key` / `owner_id`: printable characters (no control characters,
/// no whitespace but the plain space), and no space at either end. Lengths are the schema's
/// `minLength`/`maxLength`, in characters.
pub const PRINTABLE: &str = "^[^ \\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]([^\\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*[^ \\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000])?$";

/// A revoke reason: no control characters, and at least one character that is not whitespace.
pub const REASON_TEXT: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^ \\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// payment-resource's idempotency key: no control characters, no whitespace at either end.
pub const TRIMMED: &str = "^[^ \\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]([^\\u0000-\\u001f\\u007f-\\u009f]*[^ \\u0000-\\u001f\\u007f-\\u009f\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000])?$";

/// rail-stub's idempotency key: no control characters.
pub const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// ISO 4217 shape: three ASCII capitals.
pub const CURRENCY: &str = "^[A-Z]{3}$";

/// A machine-readable code (a failure reason, an error code).
pub const CODE: &str = "^[A-Z][A-Z0-9_]*$";

/// A signed grant's wire form (`dlock_grant`): unpadded base64url payload, a dot, and the unpadded
/// base64url of the 64-byte Ed25519 signature (86 characters). Its validity is the signature's, not
/// the shape's; this says only what can be one.
pub const SIGNED_GRANT: &str = "^[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]{86}$";

/// A UUID as `uuid::Uuid` parses it in its hyphenated form (either case).
pub const UUID: &str = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> regex::Regex {
        regex::Regex::new(p).expect("a valid pattern")
    }

    /// Characters at the edges of every class: each pattern must agree with its validator on all.
    fn samples() -> Vec<String> {
        let singles = [
            'a', ' ', '\t', '\n', '\u{0}', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}', '\u{a0}', '\u{a1}',
            '\u{1680}', '\u{2000}', '\u{200a}', '\u{200b}', '\u{2028}', '\u{202f}', '\u{205f}', '\u{3000}',
            '\u{feff}', 'é', '/', '%',
        ];
        let mut out = vec![String::new()];
        for a in singles {
            out.push(a.to_string());
            for b in singles {
                out.push(format!("{a}{b}"));
                out.push(format!("{a}x{b}"));
            }
        }
        out
    }

    #[test]
    fn printable_is_the_lock_key_rule() {
        let p = re(PRINTABLE);
        for s in samples() {
            assert_eq!(p.is_match(&s), crate::validate::lock_key(&s).is_ok(), "{s:?}");
        }
    }

    #[test]
    fn reason_text_is_the_revoke_reason_rule() {
        let p = re(REASON_TEXT);
        for s in samples() {
            let rule = !s.trim().is_empty() && !s.chars().any(char::is_control);
            assert_eq!(p.is_match(&s), rule, "{s:?}");
        }
    }

    #[test]
    fn trimmed_is_the_idempotency_key_rule() {
        let p = re(TRIMMED);
        for s in samples() {
            let rule = !s.is_empty() && s.chars().all(|c| !c.is_control()) && s.trim() == s;
            assert_eq!(p.is_match(&s), rule, "{s:?}");
        }
    }

    #[test]
    fn no_control_is_the_rail_key_rule() {
        let p = re(NO_CONTROL);
        for s in samples() {
            assert_eq!(p.is_match(&s), !s.chars().any(char::is_control), "{s:?}");
        }
    }

    #[test]
    fn the_token_pattern_is_what_the_parser_accepts() {
        let p = re(crate::token::DECIMAL_PATTERN);
        for s in [
            "1",
            "0001",
            "10",
            "999999999999999999",
            "1000000000000000000",
            "9223372036854775799",
            "9223372036854775806",
            "9223372036854775807",
            "9223372036854775808",
            "9223372036854775810",
            "9300000000000000000",
            "99999999999999999999",
            "0",
            "000",
            "",
            "-1",
            "+1",
            " 1",
            "1.0",
        ] {
            assert_eq!(p.is_match(s), s.parse::<crate::FencingToken>().is_ok(), "{s:?}");
        }
    }
}
