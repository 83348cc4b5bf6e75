//! Operator actions on a LockService: force-revoke one grant, and fast-forward the fencing sequence
//! after lockdb was restored from a backup (C1 §1.7).
//!
//! **Requests are annotations, not spec fields.** A one-shot field in `spec` bumps
//! `metadata.generation`; every PaymentStack that waits for its LockService's `observedGeneration` to
//! catch up would then drop to not-ready for each revoke, and tools that judge health by
//! `observedGeneration == generation` (kstatus, Flux, Argo CD) would report the LockService as
//! progressing although nothing about what it runs changed. Flux solves the same problem ("do this
//! once, now") with a requested token in an annotation echoed in status (`reconcile.fluxcd.io/
//! requestedAt` → `status.lastHandledReconcileAt`); we do the same, with the request as a small JSON
//! document in one annotation per action type, so one `kubectl annotate` (or `kubectl patch`) line
//! makes one atomic request:
//!
//! ```text
//! kubectl annotate lsvc payments-locks --overwrite \
//!   dlock.dev/revoke='{"id":"r-42","key":"account:…","reason":"stuck worker","requestedBy":"alice"}'
//! kubectl annotate lsvc payments-locks --overwrite dlock.dev/restore='{"id":"ff-1","margin":1000}'
//! ```
//!
//! The outcome is reported in `status.actions`, keyed by the request `id`; an id that is finished is
//! never executed again, whatever the annotation says later.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Annotation carrying a force-revoke request.
pub const ANNOTATION_REVOKE: &str = "dlock.dev/revoke";
/// Annotation carrying a restore fast-forward request.
pub const ANNOTATION_RESTORE: &str = "dlock.dev/restore";
/// Annotation carrying a grant-key request (add a signing key, retire one).
pub const ANNOTATION_GRANT_KEYS: &str = "dlock.dev/grant-keys";
/// How many finished actions `status.actions` keeps (the current requests are always kept).
pub const ACTION_HISTORY: usize = 10;
/// Default distance the sequence is moved past the highest token any resource has seen.
pub const DEFAULT_MARGIN: i64 = 1000;
/// Largest margin accepted: far below i64::MAX, so max(high-water) + margin cannot overflow in practice.
pub const MAX_MARGIN: i64 = 1_000_000_000_000;
/// lock-server's key limit (docs/lock-api.md): 1–256 bytes.
const MAX_KEY_BYTES: usize = 256;
const MAX_REASON_BYTES: usize = 1024;
const MAX_OPERATOR_BYTES: usize = 128;

/// `dlock.dev/revoke`: revoke the grant currently held on `key`, pinned to its fencing token.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokeRequest {
    pub id: String,
    pub key: String,
    pub reason: String,
    pub requested_by: String,
}

/// `dlock.dev/restore`: gate lock traffic, read every paydb's high-water, advance the sequence past it
/// plus `margin`, resume.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreRequest {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<i64>,
}

impl RestoreRequest {
    pub fn margin(&self) -> i64 {
        self.margin.unwrap_or(DEFAULT_MARGIN)
    }
}

/// `dlock.dev/grant-keys`: `{"id":"rot-1","action":"add"}` generates the next grant signing key;
/// `{"id":"ret-1","action":"retire","keyId":"k1"}` removes one that is no longer signed with.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantKeysRequest {
    pub id: String,
    pub action: GrantKeyAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GrantKeyAction {
    Add,
    Retire,
}

/// Why an annotation is not a usable request. The message says which field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("annotation {annotation} is not a JSON request: {message}")]
    Json {
        annotation: &'static str,
        message: String,
    },
    #[error("annotation {annotation}: {field} {problem}")]
    Field {
        annotation: &'static str,
        field: &'static str,
        problem: &'static str,
    },
}

/// A request id: what `status.actions` is keyed by. DNS-label-like, so it also fits in Job names.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && id.as_bytes()[0].is_ascii_alphanumeric()
}

fn printable(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control) && s.trim() == s
}

fn field(annotation: &'static str, field: &'static str, problem: &'static str) -> RequestError {
    RequestError::Field {
        annotation,
        field,
        problem,
    }
}

/// Reads the id out of a request that failed to parse, so the failure can still be reported under it.
pub fn id_of(raw: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let id = v.get("id")?.as_str()?;
    valid_id(id).then(|| id.to_owned())
}

/// The JSON of one request annotation, with its id checked (what every request has in common).
fn parse_request<T: serde::de::DeserializeOwned>(
    annotation: &'static str,
    raw: &str,
    id: impl FnOnce(&T) -> &str,
) -> Result<T, RequestError> {
    let r: T = serde_json::from_str(raw).map_err(|e| RequestError::Json {
        annotation,
        message: e.to_string(),
    })?;
    if !valid_id(id(&r)) {
        return Err(field(
            annotation,
            "id",
            "must be 1-63 characters of a-z, 0-9, '-' and '.', starting with a letter or digit",
        ));
    }
    Ok(r)
}

pub fn parse_revoke(raw: &str) -> Result<RevokeRequest, RequestError> {
    const A: &str = ANNOTATION_REVOKE;
    let r = parse_request(A, raw, |r: &RevokeRequest| &r.id)?;
    if !printable(&r.key, MAX_KEY_BYTES) {
        return Err(field(
            A,
            "key",
            "must be 1-256 bytes of printable characters without surrounding spaces",
        ));
    }
    if !printable(&r.reason, MAX_REASON_BYTES) {
        return Err(field(
            A,
            "reason",
            "must be 1-1024 bytes without control characters or surrounding spaces",
        ));
    }
    if !printable(&r.requested_by, MAX_OPERATOR_BYTES) {
        return Err(field(
            A,
            "requestedBy",
            "must be 1-128 bytes without control characters or surrounding spaces",
        ));
    }
    Ok(r)
}

pub fn parse_restore(raw: &str) -> Result<RestoreRequest, RequestError> {
    const A: &str = ANNOTATION_RESTORE;
    let r = parse_request(A, raw, |r: &RestoreRequest| &r.id)?;
    if r.margin.is_some_and(|m| !(1..=MAX_MARGIN).contains(&m)) {
        return Err(field(A, "margin", "must be between 1 and 10^12"));
    }
    Ok(r)
}

pub fn parse_grant_keys(raw: &str) -> Result<GrantKeysRequest, RequestError> {
    const A: &str = ANNOTATION_GRANT_KEYS;
    let r = parse_request(A, raw, |r: &GrantKeysRequest| &r.id)?;
    match (r.action, r.key_id.as_deref()) {
        (GrantKeyAction::Add, Some(_)) => Err(field(
            A,
            "keyId",
            "is not taken by add (the operator names the new key)",
        )),
        (GrantKeyAction::Retire, None) => Err(field(A, "keyId", "is required by retire")),
        (GrantKeyAction::Retire, Some(id)) if dlock_grant::KeyId::new(id).is_none() => Err(field(
            A,
            "keyId",
            "must be 1-32 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
        )),
        _ => Ok(r),
    }
}

/// Which action an entry of `status.actions` reports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ActionType {
    Revoke,
    Restore,
}

/// Lifecycle of one action. `Succeeded` and `Failed` are final: the id is never executed again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ActionPhase {
    /// Seen, not started (e.g. waiting for lock-server to be available).
    Pending,
    /// Started; `step` says where it stands. For a revoke, `targetToken` is recorded before acting.
    Running,
    Succeeded,
    Failed,
}

impl ActionPhase {
    pub fn is_final(self) -> bool {
        matches!(self, ActionPhase::Succeeded | ActionPhase::Failed)
    }
}

/// Where a running action stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ActionStep {
    /// Revoke: the current grant was read; its token is `targetToken`. Next: the pinned revoke.
    Revoke,
    /// Restore: lock-server is being scaled to zero; waiting until no pod can serve.
    Gate,
    /// Restore: the read Job reads every paydb's high-water.
    ReadHighWater,
    /// Restore: the advance Job moves `fencing_token_seq` (setval with GREATEST, never lower).
    Advance,
    /// Restore: lock-server is scaled back; waiting until it is available.
    Resume,
}

/// The highest token one PaymentStack's paydb has seen, by where it was seen.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct StackHighWater {
    /// The PaymentStack.
    pub name: String,
    /// `max(rail_high_water.highest_token)`.
    pub rail_high_water: i64,
    /// `max(account.fence)`.
    pub account_fence: i64,
    /// `max(ledger_entry.fence)`.
    pub ledger_fence: i64,
    /// `max(payout.claim_token)`.
    pub claim_token: i64,
    /// The largest of the four.
    pub highest: i64,
    /// The sequence's last value before the advance, and whether it was behind this stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_after: Option<i64>,
}

/// The outcome of one operator action, under its request id.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionStatus {
    /// The request id (the map key of `status.actions`).
    pub id: String,
    #[serde(rename = "type")]
    pub type_: ActionType,
    pub phase: ActionPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<ActionStep>,
    /// Human-readable: what happened last, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the controller first saw the request (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Revoke: the key and who asked, from the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Revoke: the fencing token of the grant to remove, recorded before the revoke is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_token: Option<i64>,
    /// Revoke: lock-server's answer (REVOKED, ALREADY_REVOKED, NOT_HELD, HELD_BY_OTHER_TOKEN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_token: Option<i64>,
    /// Revoke with HELD_BY_OTHER_TOKEN: the newer holder's token, left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_token: Option<i64>,
    /// Restore: the margin asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<i64>,
    /// Restore: per PaymentStack, the high-water read from its paydb.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackHighWater>,
    /// Restore: the sequence value the advance aims at (max high-water + margin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_sequence: Option<i64>,
    /// Restore: `fencing_token_seq`'s last value before and after the advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_after: Option<i64>,
}

impl ActionStatus {
    pub fn new(id: &str, type_: ActionType, phase: ActionPhase) -> ActionStatus {
        ActionStatus {
            id: id.to_owned(),
            type_,
            phase,
            step: None,
            message: None,
            started_at: None,
            finished_at: None,
            key: None,
            requested_by: None,
            target_token: None,
            outcome: None,
            previous_owner: None,
            previous_token: None,
            current_token: None,
            margin: None,
            stacks: Vec::new(),
            target_sequence: None,
            sequence_before: None,
            sequence_after: None,
        }
    }
}

/// Lock traffic is gated (lock-server held at zero replicas) while a restore runs, and stays gated
/// when one failed, until a restore succeeds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateStatus {
    /// The restore action that closed the gate.
    pub action_id: String,
    pub since: String,
    pub message: String,
}

/// The periodic comparison of the sequence with the resources' high-water (LockService only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencingStatus {
    /// `fencing_token_seq`'s last value when last checked.
    pub sequence: i64,
    /// The highest token any paydb of a referencing PaymentStack has seen.
    pub high_water: i64,
    /// The PaymentStack holding that high-water.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_water_stack: Option<String>,
    pub checked_at: String,
    /// Name of the Job that made the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
}

impl FencingStatus {
    /// The sequence is behind a token a resource has already seen: every new grant is fenced out.
    pub fn is_behind(&self) -> bool {
        self.sequence < self.high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_requests_parse_and_validate() {
        let r =
            parse_revoke(r#"{"id":"r-42","key":"account:1","reason":"stuck worker","requestedBy":"alice"}"#)
                .unwrap();
        assert_eq!((r.id.as_str(), r.key.as_str()), ("r-42", "account:1"));
        for (raw, needle) in [
            (r#"{"id":"R 42","key":"k","reason":"x","requestedBy":"a"}"#, "id"),
            (r#"{"id":"r","key":"","reason":"x","requestedBy":"a"}"#, "key"),
            (
                r#"{"id":"r","key":"k","reason":" x","requestedBy":"a"}"#,
                "reason",
            ),
            (
                r#"{"id":"r","key":"k","reason":"x","requestedBy":""}"#,
                "requestedBy",
            ),
            (r#"{"id":"r","key":"k","reason":"x"}"#, "requestedBy"),
            (
                r#"{"id":"r","key":"k","reason":"x","requestedBy":"a","token":5}"#,
                "token",
            ),
            ("not json", "JSON"),
        ] {
            let e = parse_revoke(raw).unwrap_err().to_string();
            assert!(e.contains(needle), "{raw}: {e}");
        }
        assert_eq!(id_of(r#"{"id":"r-1","key":""}"#).as_deref(), Some("r-1"));
        assert_eq!(id_of(r#"{"id":"R 1"}"#), None);
    }

    #[test]
    fn restore_requests_parse_and_validate() {
        let r = parse_restore(r#"{"id":"ff-1"}"#).unwrap();
        assert_eq!(r.margin(), DEFAULT_MARGIN);
        assert_eq!(parse_restore(r#"{"id":"ff-1","margin":5}"#).unwrap().margin(), 5);
        for raw in [
            r#"{"id":"ff-1","margin":0}"#,
            r#"{"id":"ff-1","margin":-3}"#,
            r#"{"id":"ff-1","margin":1000000000001}"#,
            r#"{"id":"ff-1","margin":1.5}"#,
            r#"{"margin":5}"#,
        ] {
            assert!(parse_restore(raw).is_err(), "{raw}");
        }
    }
}
