//! The action requests, as the annotations the runbook shows (docs/operations.md): built from the
//! operator's own request types and checked by the operator's own parser before anything is
//! written, so the plugin never writes a request the operator would refuse.

use chrono::{DateTime, Utc};
use dlock_operator::crd::actions::{
    ANNOTATION_RESTORE, ANNOTATION_REVOKE, RequestError, RestoreRequest, RevokeRequest, parse_restore,
    parse_revoke,
};
use rand::Rng;

/// One annotation to write: its key and its JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotation {
    pub key: &'static str,
    pub value: String,
    /// The request id inside it (what status.actions will be keyed by).
    pub id: String,
}

/// A fresh request id: `<prefix>-<UTC date>-<time>-<4 hex>`, e.g. `r-20260301-101500-3fa2`; valid
/// as the operator wants ids (1-63 of a-z 0-9 - .) and unlikely to repeat.
pub fn new_id(prefix: &str, now: DateTime<Utc>, rng: &mut impl Rng) -> String {
    format!(
        "{prefix}-{}-{:04x}",
        now.format("%Y%m%d-%H%M%S"),
        rng.random::<u16>()
    )
}

/// `dlock.dev/revoke`.
pub fn revoke(id: String, key: &str, reason: &str, requested_by: &str) -> Result<Annotation, RequestError> {
    let request = RevokeRequest {
        id,
        key: key.to_owned(),
        reason: reason.to_owned(),
        requested_by: requested_by.to_owned(),
    };
    let value = to_json(&request);
    let checked = parse_revoke(&value)?;
    Ok(Annotation {
        key: ANNOTATION_REVOKE,
        value,
        id: checked.id,
    })
}

/// `dlock.dev/restore`.
pub fn restore(id: String, margin: Option<i64>) -> Result<Annotation, RequestError> {
    let value = to_json(&RestoreRequest { id, margin });
    let checked = parse_restore(&value)?;
    Ok(Annotation {
        key: ANNOTATION_RESTORE,
        value,
        id: checked.id,
    })
}

fn to_json<T: serde::Serialize>(request: &T) -> String {
    // Serialising these plain structs of strings and integers cannot fail.
    serde_json::to_string(request).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The JSON of `annotation` in the runbook's `kubectl annotate` lines (the text between the
    /// quotes after `annotation=`).
    fn runbook_json(annotation: &str) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
        let doc = std::fs::read_to_string(path).expect("read docs/operations.md");
        let marker = format!("{annotation}='");
        let start = doc
            .find(&marker)
            .unwrap_or_else(|| panic!("the runbook shows no {annotation} request"))
            + marker.len();
        let len = doc[start..].find('\'').expect("closing quote");
        doc[start..start + len].to_owned()
    }

    #[test]
    fn revoke_writes_the_annotation_the_runbook_shows() {
        let shown = runbook_json(ANNOTATION_REVOKE);
        let v: serde_json::Value = serde_json::from_str(&shown).expect("the runbook's JSON parses");
        let field = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("no {k} in {shown}"))
                .to_owned()
        };
        let a = revoke(
            field("id"),
            &field("key"),
            &field("reason"),
            &field("requestedBy"),
        )
        .unwrap();
        assert_eq!(a.key, "dlock.dev/revoke");
        assert_eq!(a.value, shown, "byte for byte");
        assert_eq!(a.id, field("id"));
    }

    #[test]
    fn restore_writes_the_annotation_the_runbook_shows() {
        let shown = runbook_json(ANNOTATION_RESTORE);
        let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
        let a = restore(v["id"].as_str().unwrap().to_owned(), v["margin"].as_i64()).unwrap();
        assert_eq!((a.key, a.value.as_str()), ("dlock.dev/restore", shown.as_str()));
        // Without a margin the operator's default applies: the field is left out.
        assert_eq!(restore("ff-2".into(), None).unwrap().value, r#"{"id":"ff-2"}"#);
    }

    #[test]
    fn what_the_operator_would_refuse_is_refused_here() {
        assert!(
            revoke("R 1".into(), "k", "r", "a")
                .unwrap_err()
                .to_string()
                .contains("id")
        );
        assert!(
            revoke("r-1".into(), "", "r", "a")
                .unwrap_err()
                .to_string()
                .contains("key")
        );
        assert!(
            revoke("r-1".into(), "k", " r", "a")
                .unwrap_err()
                .to_string()
                .contains("reason")
        );
        assert!(
            revoke("r-1".into(), "k", "r", "")
                .unwrap_err()
                .to_string()
                .contains("requestedBy")
        );
        assert!(
            restore("ff-1".into(), Some(0))
                .unwrap_err()
                .to_string()
                .contains("margin")
        );
        assert!(restore("ff-1".into(), Some(1_000_000_000_001)).is_err());
    }

    #[test]
    fn generated_ids_are_valid_and_differ() {
        let now = DateTime::parse_from_rfc3339("2026-03-01T10:15:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let a = new_id("r", now, &mut rng);
        let b = new_id("r", now, &mut rng);
        assert!(a.starts_with("r-20260301-101500-") && a.len() == 22, "{a}");
        assert_ne!(a, b);
        // The operator accepts it as an id.
        assert_eq!(revoke(a.clone(), "k", "r", "u").unwrap().id, a);
        assert_eq!(restore(new_id("ff", now, &mut rng), None).unwrap().id.len(), 23);
    }
}
