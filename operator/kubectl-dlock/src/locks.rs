//! `kubectl dlock locks`: the keys held under a LockService, from lock-server's `GET /v1/locks`
//! (admin; keyset pages of [`dlock_wire::lock::LockList`]) through dlock's own client.

use dlock_client::{ClientConfig, LockClient, LockListItem};

/// Keys per page asked for (lock-server's largest page).
pub const PAGE_LIMIT: i64 = dlock_wire::lock::MAX_LIST_PAGE;
/// Pages read at most (a runaway cursor must end).
pub const MAX_PAGES: usize = 1_000;

/// Every held key starting with `prefix`, page by page, from lock-server at `base_url`; over HTTPS
/// trusting only `ca_pem` (the namespace's CA bundle), connected to `connect_to` when given (the
/// port-forward) while the certificate is checked for the URL's host.
pub async fn list(
    base_url: &str,
    admin_token: &str,
    prefix: &str,
    ca_pem: Option<&str>,
    connect_to: Option<std::net::SocketAddr>,
) -> Result<Vec<LockListItem>, dlock_client::ClientError> {
    let mut config = ClientConfig::default();
    if let Some(ca) = ca_pem {
        config = config.with_ca_pem(ca.as_bytes().to_vec());
    }
    if let Some(addr) = connect_to {
        config = config.with_connect_to(addr);
    }
    let client = LockClient::with_config(base_url, config)?;
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = client
            .api()
            .list_locks(admin_token, prefix, after.as_deref(), PAGE_LIMIT)
            .await?;
        all.extend(page.items);
        match page.next_cursor {
            Some(next) if after.as_deref() != Some(next.as_str()) => after = Some(next),
            _ => break,
        }
    }
    Ok(all)
}

/// The table printed.
pub fn render(locks: &[LockListItem]) -> String {
    let mut out = format!(
        "{:<48} {:<8} {:>14} {:<24} {:<26} {:>7}\n",
        "KEY", "STATE", "TOKEN", "OWNER", "EXPIRES", "WAITING"
    );
    for l in locks {
        out.push_str(&format!(
            "{:<48} {:<8} {:>14} {:<24} {:<26} {:>7}\n",
            l.lock_key,
            format!("{:?}", l.state).to_uppercase(),
            l.fencing_token.to_string(),
            l.owner_id,
            l.expires_at.to_rfc3339(),
            l.waiters,
        ));
    }
    out
}

/// `-o json`: the LockService, the prefix asked for and lock-server's items as its API names them
/// (`lockKey`, `state`, `fencingToken`, `ownerId`, `sessionId`, `acquiredAt`, `expiresAt`,
/// `waiters`).
pub fn json(namespace: &str, lock_service: &str, prefix: &str, locks: &[LockListItem]) -> String {
    let doc = serde_json::json!({
        "namespace": namespace,
        "lockService": lock_service,
        "prefix": prefix,
        "items": locks,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_renders_one_line_per_key() {
        let page: dlock_wire::lock::LockList = serde_json::from_str(
            r#"{"items":[{"lockKey":"account:7","state":"HELD","fencingToken":42,"ownerId":"ex-1",
                 "sessionId":"00000000-0000-4000-8000-000000000001",
                 "acquiredAt":"2026-03-01T10:00:00Z","expiresAt":"2026-03-01T10:00:10Z","waiters":2}],
                "nextCursor":"account:7"}"#,
        )
        .unwrap();
        let text = render(&page.items);
        assert_eq!(text.lines().count(), 2, "{text}");
        let line = text.lines().nth(1).unwrap();
        assert!(line.starts_with("account:7"), "{text}");
        for want in ["HELD", "42", "ex-1", "2026-03-01T10:00:10+00:00"] {
            assert!(line.contains(want), "{want} in {line}");
        }
        assert!(line.trim_end().ends_with('2'), "the waiters: {line}");
    }

    #[test]
    fn json_lists_the_items_with_lock_servers_field_names() {
        let page: dlock_wire::lock::LockList = serde_json::from_str(
            r#"{"items":[{"lockKey":"account:7","state":"HELD","fencingToken":42,"ownerId":"ex-1",
                 "sessionId":"00000000-0000-4000-8000-000000000001",
                 "acquiredAt":"2026-03-01T10:00:00Z","expiresAt":"2026-03-01T10:00:10Z","waiters":2}]}"#,
        )
        .unwrap();
        let doc: serde_json::Value =
            serde_json::from_str(&json("pay", "locks", "account:", &page.items)).unwrap();
        assert_eq!(doc["namespace"], "pay");
        assert_eq!(doc["lockService"], "locks");
        assert_eq!(doc["prefix"], "account:");
        let item = &doc["items"][0];
        assert_eq!(item["lockKey"], "account:7");
        assert_eq!(item["state"], "HELD");
        assert_eq!(item["fencingToken"], 42);
        assert_eq!(item["ownerId"], "ex-1");
        assert_eq!(item["waiters"], 2);
        let back: Vec<LockListItem> = serde_json::from_value(doc["items"].clone()).unwrap();
        assert_eq!(back, page.items);
        let empty: serde_json::Value = serde_json::from_str(&json("pay", "locks", "", &[])).unwrap();
        assert_eq!(empty["items"], serde_json::json!([]));
    }
}
