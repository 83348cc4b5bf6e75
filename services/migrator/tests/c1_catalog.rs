//! The migrated schemas are C1's, to the letter: C1's DDL is cut out of the contract text
//! (docs/contracts/C1-database-schemas.txt) and applied to one empty database, the migration history
//! to another, and the two catalogs must not differ in any table, column, type, default, constraint,
//! index or sequence setting.

use std::collections::BTreeSet;

use dlock_migrate::{load_dir, migrate};
use dlock_testkit::{History, TestDb, blank, migrations_dir};
use sqlx::{Connection, PgConnection};

const C1: &str = include_str!("../../../docs/contracts/C1-database-schemas.txt");

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("C1 lost its marker {start:?}"));
    let to = text[from..]
        .find(end)
        .unwrap_or_else(|| panic!("C1 lost its marker {end:?}"))
        + from;
    &text[from..to]
}

fn c1_ddl(history: History) -> &'static str {
    match history {
        History::Lockdb => between(
            C1,
            "CREATE SEQUENCE fencing_token_seq",
            "lock_entry holds one row",
        ),
        History::Paydb => between(C1, "CREATE TABLE account (", "Constraint Invariant it encodes"),
    }
}

/// Every schema fact we compare, as sortable text lines.
async fn catalog(c: &mut PgConnection) -> BTreeSet<String> {
    let queries: [&'static str; 4] = [
        // columns: type, nullability, default
        "SELECT format('column %s.%s %s notnull=%s default=%s', c.relname, a.attname,
                format_type(a.atttypid, a.atttypmod), a.attnotnull,
                coalesce(pg_get_expr(d.adbin, d.adrelid), '-'))
           FROM pg_attribute a
           JOIN pg_class c ON c.oid = a.attrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
            AND c.relname <> 'flyway_schema_history'",
        // constraints: name and full definition
        "SELECT format('constraint %s.%s %s', c.relname, k.conname, pg_get_constraintdef(k.oid))
           FROM pg_constraint k
           JOIN pg_class c ON c.oid = k.conrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'public' AND c.relname <> 'flyway_schema_history'",
        // indexes, including the partial and unique ones
        "SELECT format('index %s', indexdef) FROM pg_indexes
          WHERE schemaname = 'public' AND tablename <> 'flyway_schema_history'",
        // sequences with every setting (default cache, no cycle)
        "SELECT format('sequence %s %s start=%s min=%s max=%s inc=%s cycle=%s cache=%s', sequencename,
                data_type, start_value, min_value, max_value, increment_by, cycle, cache_size)
           FROM pg_sequences WHERE schemaname = 'public'",
    ];
    let mut out = BTreeSet::new();
    for q in queries {
        let rows: Vec<String> = sqlx::query_scalar(q)
            .fetch_all(&mut *c)
            .await
            .expect("catalog query");
        out.extend(rows);
    }
    out
}

async fn connect(db: &TestDb) -> PgConnection {
    PgConnection::connect(&db.admin_url()).await.expect("connect")
}

async fn compare(history: History) {
    let from_contract = blank(history).await;
    let mut c = connect(&from_contract).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(c1_ddl(history)))
        .execute(&mut c)
        .await
        .expect("apply C1 text");
    let expected = catalog(&mut c).await;

    let from_migrations = blank(history).await;
    let mut m = connect(&from_migrations).await;
    let files = load_dir(&migrations_dir(history)).expect("load migrations");
    migrate(&mut m, &files).await.expect("migrate");
    let actual = catalog(&mut m).await;

    assert!(
        expected.len() > 20,
        "the C1 extract looks too small: {expected:#?}"
    );
    let missing: Vec<_> = expected.difference(&actual).collect();
    // Later V<n> migrations may add to C1 (never change it): only C1's own facts must all be there.
    assert!(
        missing.is_empty(),
        "{} differs from C1; missing or changed: {missing:#?}",
        history.name()
    );
    let v1_only = blank(history).await;
    let mut v = connect(&v1_only).await;
    let v1: Vec<_> = files
        .iter()
        .filter(|f| f.script.starts_with("V1__"))
        .cloned()
        .collect();
    migrate(&mut v, &v1).await.expect("migrate V1");
    assert_eq!(
        catalog(&mut v).await,
        expected,
        "V1 of {} must be exactly C1's DDL",
        history.name()
    );
}

#[tokio::test]
async fn lockdb_matches_c1() {
    compare(History::Lockdb).await;
}

#[tokio::test]
async fn paydb_matches_c1() {
    compare(History::Paydb).await;
}
