//! The test kit's replication and physical-backup support against real PostgreSQL 16 servers: a
//! streaming standby (pg_basebackup), synchronous replication, a standby held behind and then
//! promoted (what an asynchronous failover loses), a base backup and a file-system copy of PGDATA
//! restored in place.

use std::time::{Duration, Instant};

use dlock_testkit::{PgError, PgServer};

/// Polls `probe` (every 25 ms) until it is true; panics naming `what` after 15 s.
fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    let started = Instant::now();
    while !probe() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}: not within 15 s"
        );
        // Another server's state: nothing to block on but the next look.
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn rows(server: &PgServer) -> String {
    server
        .sql("postgres", "SELECT string_agg(v, ',' ORDER BY v) FROM t")
        .expect("read t")
}

/// The timeline the server writes on: the first eight hex digits of its current WAL file's name.
fn timeline(server: &PgServer) -> String {
    let file = server
        .sql("postgres", "SELECT pg_walfile_name(pg_current_wal_lsn())")
        .expect("current WAL file");
    file[..8].to_owned()
}

#[test]
fn held_standby_promoted_lacks_what_it_never_received() {
    let mut primary = PgServer::start("repl-async-primary").expect("primary");
    primary
        .sql("postgres", "CREATE TABLE t (v text); INSERT INTO t VALUES ('a')")
        .expect("set up");
    let label = "repl_async_standby";
    let standby = PgServer::start_standby(&primary, label, &[]).expect("standby");
    assert_eq!(
        standby
            .sql("postgres", "SELECT status FROM pg_stat_wal_receiver")
            .unwrap(),
        "streaming"
    );
    assert_eq!(
        primary
            .sql(
                "postgres",
                &format!(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{label}'"
                ),
            )
            .unwrap(),
        "streaming|async"
    );
    assert_eq!(rows(&standby), "a", "the base backup carries the primary's rows");
    assert_eq!(
        standby.sql("postgres", "SELECT pg_is_in_recovery()").unwrap(),
        "t"
    );
    match standby.sql("postgres", "INSERT INTO t VALUES ('x')") {
        Err(PgError::Tool { stderr, .. }) => assert!(stderr.contains("read-only"), "{stderr}"),
        other => panic!("a standby took a write: {other:?}"),
    }

    primary.sql("postgres", "INSERT INTO t VALUES ('b')").unwrap();
    eventually("the standby replays b", || rows(&standby) == "a,b");

    standby.hold_behind().expect("hold behind");
    assert_eq!(
        standby
            .sql("postgres", "SELECT count(*) FROM pg_stat_wal_receiver")
            .unwrap(),
        "0"
    );
    primary.sql("postgres", "INSERT INTO t VALUES ('c')").unwrap();
    // The insert position: with the test kit's synchronous_commit=off the commit may not be
    // written out yet.
    let primary_lsn = primary
        .sql("postgres", "SELECT pg_current_wal_insert_lsn()")
        .unwrap();
    assert_eq!(
        standby
            .sql(
                "postgres",
                &format!("SELECT pg_last_wal_receive_lsn() < '{primary_lsn}'::pg_lsn"),
            )
            .unwrap(),
        "t",
        "the held standby is behind the primary"
    );
    assert_eq!(rows(&standby), "a,b");
    assert_eq!(timeline(&primary), "00000001");

    primary.crash();
    standby.promote().expect("promote");
    assert_eq!(
        standby.sql("postgres", "SELECT pg_is_in_recovery()").unwrap(),
        "f"
    );
    standby
        .sql("postgres", "INSERT INTO t VALUES ('d')")
        .expect("the promoted standby takes writes");
    assert_eq!(
        rows(&standby),
        "a,b,d",
        "c was acknowledged by the primary and is lost"
    );
    assert_eq!(timeline(&standby), "00000002", "promotion starts a new timeline");
}

#[test]
fn synchronous_standby_has_each_commit_when_it_returns() {
    let label = "repl_sync_standby";
    let sync = [("synchronous_commit", "on"), ("synchronous_standby_names", label)];
    let primary = PgServer::start_with("repl-sync-primary", &sync).expect("primary");
    // No standby yet: a synchronous commit would wait for ever, so this one commits locally.
    primary
        .sql(
            "postgres",
            "SET synchronous_commit = local; CREATE TABLE t (v text)",
        )
        .expect("set up");
    let standby = PgServer::start_standby(&primary, label, &[("synchronous_commit", "on")]).expect("standby");
    let state =
        format!("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{label}'");
    eventually("the standby is the synchronous one", || {
        primary
            .sql("postgres", &state)
            .is_ok_and(|s| s == "streaming|sync")
    });

    // synchronous_commit=on: the COMMIT returned once the standby had flushed the commit record,
    // so it has received at least everything the transaction wrote before it.
    let lsn = primary
        .sql(
            "postgres",
            "WITH i AS (INSERT INTO t VALUES ('on') RETURNING 1) SELECT pg_current_wal_insert_lsn() FROM i",
        )
        .expect("a synchronous commit");
    assert_eq!(
        standby
            .sql(
                "postgres",
                &format!("SELECT pg_last_wal_receive_lsn() >= '{lsn}'::pg_lsn"),
            )
            .unwrap(),
        "t"
    );
    // remote_apply: visible on the standby when the COMMIT returns.
    primary
        .sql(
            "postgres",
            "SET synchronous_commit = remote_apply; INSERT INTO t VALUES ('remote_apply')",
        )
        .expect("a remote_apply commit");
    assert_eq!(rows(&standby), "on,remote_apply");

    // With the standby held behind, a commit waits for it (statement_timeout does not end the
    // wait: it is over before COMMIT); cancelling the wait returns success with a warning:
    // committed locally, never replicated.
    standby.hold_behind().expect("hold behind");
    let waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
    std::thread::scope(|s| {
        let insert = s.spawn(|| primary.sql("postgres", "INSERT INTO t VALUES ('cancelled_wait')"));
        eventually("the commit waits for the held standby", || {
            primary.sql("postgres", waiting).is_ok_and(|pid| !pid.is_empty())
        });
        primary
            .sql(
                "postgres",
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            )
            .expect("cancel the wait");
        insert
            .join()
            .expect("the inserting thread")
            .expect("a cancelled synchronous wait still reports success");
    });
    assert_eq!(rows(&primary), "cancelled_wait,on,remote_apply");
    assert_eq!(rows(&standby), "on,remote_apply");
}

#[test]
fn restored_base_backup_comes_up_as_a_primary_on_its_timeline() {
    let mut server = PgServer::start("repl-backup").expect("server");
    server
        .sql(
            "postgres",
            "CREATE TABLE t (v text); INSERT INTO t VALUES ('before')",
        )
        .expect("set up");
    let system = "SELECT system_identifier FROM pg_control_system()";
    let id = server.sql("postgres", system).unwrap();
    let started = server
        .sql("postgres", "SELECT pg_postmaster_start_time()")
        .unwrap();

    let backup = server.base_backup("repl-backup-copy").expect("base backup");
    assert!(backup.join("backup_label").is_file());
    assert!(!backup.join("standby.signal").exists());
    server.sql("postgres", "INSERT INTO t VALUES ('after')").unwrap();

    assert!(
        matches!(server.restore_pgdata(&backup), Err(PgError::State(_))),
        "running"
    );
    server.shutdown().expect("shutdown");
    server.restore_pgdata(&backup).expect("restore");
    server.restart().expect("restart on the restored copy");

    assert_eq!(rows(&server), "before", "the backup's state, not the later write");
    assert_eq!(server.sql("postgres", "SELECT pg_is_in_recovery()").unwrap(), "f");
    server
        .sql("postgres", "INSERT INTO t VALUES ('restored')")
        .expect("a write");
    // Crash recovery from the backup_label, no archive recovery: the same timeline and system.
    assert_eq!(timeline(&server), "00000001");
    assert_eq!(server.sql("postgres", system).unwrap(), id);
    assert_ne!(
        server
            .sql("postgres", "SELECT pg_postmaster_start_time()")
            .unwrap(),
        started
    );
}

#[test]
fn copy_of_a_shut_down_pgdata_restores_in_place() {
    let mut server = PgServer::start("repl-copy").expect("server");
    server
        .sql(
            "postgres",
            "CREATE TABLE t (v text); INSERT INTO t VALUES ('snapshot')",
        )
        .expect("set up");
    assert!(
        matches!(server.copy_pgdata("repl-copy-snap"), Err(PgError::State(_))),
        "running"
    );
    server.shutdown().expect("shutdown");
    let snapshot = server.copy_pgdata("repl-copy-snap").expect("copy");
    assert!(snapshot.join("PG_VERSION").is_file());
    server.restart().expect("restart");
    server.sql("postgres", "INSERT INTO t VALUES ('later')").unwrap();
    assert_eq!(rows(&server), "later,snapshot");

    server.shutdown().expect("shutdown");
    server.restore_pgdata(&snapshot).expect("restore");
    server.restart().expect("restart on the copy");
    assert_eq!(rows(&server), "snapshot");
    server
        .sql("postgres", "INSERT INTO t VALUES ('again')")
        .expect("a write");
    assert_eq!(timeline(&server), "00000001");
}
