//! `kubectl dlock locks`: the locks held under a LockService, from lock-server's list route.
//!
//! **The route is `GET /v1/locks?prefix=P&after=K&limit=N`**, specified by issue 17 ("who holds
//! what": key, state, owner, token, expiry and the queue length, with keyset paging) and not served
//! by every lock-server yet; its body is read here in the shape that specification names:
//! `{"locks": [<LockView fields> + "queueLength"], "nextAfter": <key or null>}`. Until the wire
//! crate defines it, [`Page`] is that shape; a lock-server without the route answers 404, which is
//! reported as such.

use dlock_wire::lock::LockView;
use serde::Deserialize;

/// Keys per page asked for.
pub const PAGE_LIMIT: u32 = 500;
/// Pages read at most (a runaway cursor must end).
pub const MAX_PAGES: usize = 1_000;

/// One lock of the list: the single-key view plus its waiters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    #[serde(flatten)]
    pub view: LockView,
    #[serde(default)]
    pub queue_length: Option<u64>,
}

/// One page of the list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub locks: Vec<Listed>,
    #[serde(default)]
    pub next_after: Option<String>,
}

/// The path and query of one page.
pub fn page_path(prefix: &str, after: Option<&str>) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("prefix", prefix);
    if let Some(a) = after {
        q.append_pair("after", a);
    }
    q.append_pair("limit", &PAGE_LIMIT.to_string());
    format!("/v1/locks?{}", q.finish())
}

/// The table printed.
pub fn render(locks: &[Listed]) -> String {
    let mut out = format!(
        "{:<48} {:<8} {:>14} {:<24} {:<26} {:>7}\n",
        "KEY", "STATE", "TOKEN", "OWNER", "EXPIRES", "WAITING"
    );
    for l in locks {
        let v = &l.view;
        out.push_str(&format!(
            "{:<48} {:<8} {:>14} {:<24} {:<26} {:>7}\n",
            v.lock_key,
            format!("{:?}", v.state).to_uppercase(),
            v.fencing_token
                .map(|t| t.to_string())
                .unwrap_or_else(|| "-".into()),
            v.owner_id.as_deref().unwrap_or("-"),
            v.expires_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into()),
            l.queue_length
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_path_encodes_the_prefix_and_the_cursor() {
        assert_eq!(
            page_path("account:", None),
            "/v1/locks?prefix=account%3A&limit=500"
        );
        assert_eq!(
            page_path("a b", Some("account:7")),
            "/v1/locks?prefix=a+b&after=account%3A7&limit=500"
        );
    }

    #[test]
    fn a_page_in_the_documented_shape_reads_and_renders() {
        let page: Page = serde_json::from_str(
            r#"{"locks":[{"lockKey":"account:7","state":"HELD","fencingToken":42,"ownerId":"ex-1",
                 "acquiredAt":"2026-03-01T10:00:00Z","expiresAt":"2026-03-01T10:00:10Z","queueLength":2},
                {"lockKey":"account:8","state":"EXPIRED","fencingToken":40,"ownerId":"ex-2",
                 "acquiredAt":"2026-03-01T09:00:00Z","expiresAt":"2026-03-01T09:00:10Z"}],
                "nextAfter":"account:8"}"#,
        )
        .unwrap();
        assert_eq!(page.next_after.as_deref(), Some("account:8"));
        let text = render(&page.locks);
        assert!(text.lines().nth(1).unwrap().starts_with("account:7"), "{text}");
        assert!(
            text.contains("HELD") && text.contains("42") && text.contains("ex-1"),
            "{text}"
        );
        assert!(
            text.lines().nth(2).unwrap().trim_end().ends_with('-'),
            "no queue length: {text}"
        );
    }
}
