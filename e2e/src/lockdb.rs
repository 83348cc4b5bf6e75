//! lockdb read directly, as the ground truth of the actions' tests (the tables are C1's): who holds
//! a key, its revocations, the fencing sequence.

use dlock_testkit::TestDb;

/// `(owner, token)` of the grant on `key`, if any.
pub async fn holder(db: &TestDb, key: &str) -> Option<(String, i64)> {
    sqlx::query_as("SELECT owner_id, fencing_token FROM lock_entry WHERE lock_key = $1")
        .bind(key)
        .fetch_optional(&db.admin_pool().await)
        .await
        .unwrap_or_else(|e| panic!("read lock_entry: {e}"))
}

/// `(previous token, previous owner, operator)` of every revocation of `key`, in order.
pub async fn revocations(db: &TestDb, key: &str) -> Vec<(i64, String, String)> {
    sqlx::query_as(
        "SELECT prev_token, prev_owner, operator FROM lock_revocation WHERE lock_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(&db.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("read lock_revocation: {e}"))
}

/// The last token `fencing_token_seq` handed out (0 before the first).
pub async fn sequence(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT (CASE WHEN is_called THEN last_value ELSE last_value - 1 END)::BIGINT FROM fencing_token_seq",
    )
    .fetch_one(&db.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("read the sequence: {e}"))
}
