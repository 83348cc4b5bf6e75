//! The fast-forward against real PostgreSQL 16 (lockdb and paydb on separate servers).

use dlock_fastforward::{advance, read_high_water, read_sequence};

const A1: &str = "00000000-0000-4000-8000-000000000001";
const A2: &str = "00000000-0000-4000-8000-000000000002";

async fn exec(pool: &sqlx::PgPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test]
async fn reads_the_highest_token_of_each_fenced_resource() {
    let paydb = dlock_testkit::paydb().await;
    let pool = paydb.admin_pool().await;
    // A fresh paydb has seen no token at all.
    let empty = read_high_water("paydb", &paydb.admin_url()).await.unwrap();
    assert_eq!(empty.highest, 0);

    exec(
        &pool,
        &format!("UPDATE account SET fence = 500 WHERE account_id = '{A1}'"),
    )
    .await;
    exec(
        &pool,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A2}', 700)"),
    )
    .await;
    exec(
        &pool,
        &format!(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, idempotency_key)
             VALUES ('10000000-0000-4000-8000-000000000001', '{A1}', 100, 'EUR', 'CLAIMED', 'w', 650, 'k1')"
        ),
    )
    .await;
    let hw = read_high_water("paydb", &paydb.admin_url()).await.unwrap();
    assert_eq!(
        (
            hw.account_fence,
            hw.rail_high_water,
            hw.claim_token,
            hw.ledger_fence,
            hw.highest
        ),
        (500, 700, 650, 0, 700)
    );
    // The highest may sit in any of the four: a claim token above the rest wins.
    exec(&pool, "UPDATE payout SET claim_token = 900").await;
    assert_eq!(
        read_high_water("paydb", &paydb.admin_url())
            .await
            .unwrap()
            .highest,
        900
    );
}

#[tokio::test]
async fn an_unreadable_paydb_is_named_and_its_url_is_not_printed() {
    let paydb = dlock_testkit::paydb().await;
    let pool = paydb.admin_pool().await;
    exec(
        &pool,
        "ALTER TABLE rail_high_water RENAME TO rail_high_water_gone",
    )
    .await;
    let e = read_high_water("paydb of PaymentStack p2", &paydb.admin_url())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("paydb of PaymentStack p2: ") && e.contains("rail_high_water"),
        "{e}"
    );
    let e = read_high_water(
        "paydb of PaymentStack p3",
        "postgres://payapp:s3cret@127.0.0.1:1/paydb",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("p3") && !e.contains("s3cret"), "{e}");
}

#[tokio::test]
async fn advance_moves_the_sequence_past_the_target_and_never_lowers_it() {
    let lockdb = dlock_testkit::lockdb().await;
    let url = lockdb.admin_url();
    let pool = lockdb.admin_pool().await;
    assert_eq!(
        read_sequence(&url).await.unwrap(),
        0,
        "a fresh sequence has handed out nothing"
    );
    for _ in 0..5 {
        exec(&pool, "SELECT nextval('fencing_token_seq')").await;
    }
    assert_eq!(read_sequence(&url).await.unwrap(), 5);

    let a = advance(&url, 1700).await.unwrap();
    assert_eq!((a.before, a.after), (5, 1700));
    let next: i64 = sqlx::query_scalar("SELECT nextval('fencing_token_seq')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, 1701, "the next grant is above the target");

    // Never lower: a smaller target leaves the sequence where it is; a re-run changes nothing.
    let a = advance(&url, 100).await.unwrap();
    assert_eq!((a.before, a.after), (1701, 1701));
    let a = advance(&url, 1701).await.unwrap();
    assert_eq!((a.before, a.after), (1701, 1701));
    assert!(advance(&url, 0).await.is_err());

    // Negative control: a plain setval (without GREATEST) to the same smaller target does rewind it,
    // which is exactly what the statement must never do.
    let rewound: i64 = sqlx::query_scalar("SELECT setval('fencing_token_seq', 100, true)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rewound, 100);
    assert_eq!(read_sequence(&url).await.unwrap(), 100);
}
