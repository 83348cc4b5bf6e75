//! `kubectl dlock locks`: the keys held under a LockService, from lock-server's `GET /v1/locks`
//! (admin; keyset pages of [`dlock_wire::lock::LockList`]) through dlock's own client.

use dlock_client::{LockClient, LockListItem};

/// Keys per page asked for (lock-server's largest page).
pub const PAGE_LIMIT: i64 = dlock_wire::lock::MAX_LIST_PAGE;
/// Pages read at most (a runaway cursor must end).
pub const MAX_PAGES: usize = 1_000;

/// Every held key starting with `prefix`, page by page.
pub async fn list(
    base_url: &str,
    admin_token: &str,
    prefix: &str,
) -> Result<Vec<LockListItem>, dlock_client::ClientError> {
    let client = LockClient::new(base_url)?;
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
}
