//! Reading a watch (`GET /v1/locks/{key}/watch`, server-sent events): the key's state first, then
//! each change of its holder. A stream ends when the server's watch lifetime is over; a new one
//! starts from the state again, so nothing is lost by reconnecting.

use std::sync::Arc;
use std::time::Duration;

use dlock_wire::FencingToken;
use dlock_wire::lock::{LockEvent, LockEventType, LockState, LockView};
use tokio_util::sync::CancellationToken;

use crate::api::LockApi;
use crate::error::{ClientError, LossReason, error_from_body};
use crate::liveness::Liveness;

// The watch call of [`LockApi`] lives here, beside the stream it opens, so that `api` needs
// nothing of this module (whose guard calls `LockApi`).
impl LockApi {
    /// `GET /v1/locks/{key}/watch`: the key's state, then its changes, until the server ends the
    /// stream (after its watch lifetime; `max_stream` bounds how long this client waits for that).
    pub async fn watch(&self, key: &str, max_stream: Duration) -> Result<LockWatch, ClientError> {
        let response = self
            .request(reqwest::Method::GET, self.url(&["v1", "locks", key, "watch"]))
            .timeout(max_stream)
            .send()
            .await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await?;
            return Err(error_from_body(status, &body));
        }
        Ok(LockWatch::new(response))
    }
}

/// One message of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    /// The key as it is (the first message of every stream).
    State(LockView),
    /// A change of its holder.
    Change(LockEvent),
}

/// An open watch stream.
#[derive(Debug)]
pub struct LockWatch {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl LockWatch {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buf: Vec::new(),
        }
    }

    /// The next message; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<WatchItem>, ClientError> {
        loop {
            if let Some(at) = find(&self.buf, b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..at + 2).collect();
                if let Some(item) = parse(&block)? {
                    return Ok(Some(item));
                }
                continue;
            }
            match self.response.chunk().await? {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
    }
}

/// Upper bound of one watch stream as this client waits for it (the server ends its streams sooner,
/// after its `--watch-max-ms`, 5 minutes by default).
pub(crate) const MAX_STREAM: Duration = Duration::from_secs(3600);

/// How a handle's grant ended, as a watch of its key tells it; `None`: still ours.
fn ended(token: FencingToken, item: &WatchItem) -> Option<LossReason> {
    match item {
        WatchItem::State(v) => match (v.state, v.fencing_token) {
            (LockState::Held, Some(t)) if t == token => None,
            // Free, lapsed, or another grant: ours is gone.
            _ => Some(LossReason::LeaseExpired),
        },
        WatchItem::Change(e) if e.fencing_token == token => match e.kind {
            LockEventType::Granted => None,
            LockEventType::Revoked => Some(LossReason::Revoked),
            LockEventType::SessionEnded => Some(LossReason::SessionGone),
            LockEventType::Released | LockEventType::Expired => Some(LossReason::LeaseExpired),
        },
        WatchItem::Change(e) if e.kind == LockEventType::Granted && e.fencing_token > token => {
            Some(LossReason::LeaseExpired)
        }
        WatchItem::Change(_) => None,
    }
}

/// Watches a handle's key until the handle stops or is lost, and declares it lost the moment the
/// server says its grant went (revoked, lapsed, its session ended, taken over): not at the next
/// renewal. Reconnects after the server ends a stream or a failure.
pub(crate) async fn guard(
    api: LockApi,
    key: String,
    token: FencingToken,
    live: Arc<Liveness>,
    stop: CancellationToken,
) {
    let lost = live.lost_token();
    loop {
        let run = async {
            let mut watch = api.watch(&key, MAX_STREAM).await?;
            while let Some(item) = watch.next().await? {
                if let Some(reason) = ended(token, &item) {
                    return Ok::<_, ClientError>(Some(reason));
                }
            }
            Ok(None)
        };
        let outcome = tokio::select! {
            () = stop.cancelled() => return,
            () = lost.cancelled() => return,
            r = run => r,
        };
        match outcome {
            Ok(Some(reason)) => {
                tracing::warn!(event = "lock_lost", lock_key = %key, fencing_token = %token, %reason, "the watch says the grant is gone");
                live.lose(reason);
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(event = "watch_failed", lock_key = %key, error = %e);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = lost.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One event block (`event:` and `data:` lines); comments (keep-alives) and unknown events are
/// `None`.
fn parse(block: &[u8]) -> Result<Option<WatchItem>, ClientError> {
    let text = std::str::from_utf8(block)
        .map_err(|e| ClientError::Protocol(format!("a watch event that is not UTF-8: {e}")))?;
    let mut name = "message";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim_start();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    let bad = |e: serde_json::Error| ClientError::Protocol(format!("cannot read a watch {name} event: {e}"));
    Ok(match name {
        "state" => Some(WatchItem::State(serde_json::from_str(&data).map_err(bad)?)),
        "change" => Some(WatchItem::Change(serde_json::from_str(&data).map_err(bad)?)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_comments() {
        assert_eq!(parse(b":\n\n").unwrap(), None);
        let state = parse(b"event: state\ndata: {\"lockKey\":\"k\",\"state\":\"FREE\"}\n\n")
            .unwrap()
            .unwrap();
        assert!(matches!(state, WatchItem::State(v) if v.lock_key == "k"));
        let change =
            parse(b"event: change\ndata: {\"type\":\"REVOKED\",\"lockKey\":\"k\",\"fencingToken\":7}\n\n")
                .unwrap()
                .unwrap();
        assert!(
            matches!(change, WatchItem::Change(e) if e.kind == dlock_wire::lock::LockEventType::Revoked && e.fencing_token.get() == 7)
        );
        assert!(parse(b"event: change\ndata: {\n\n").is_err());
    }
}
