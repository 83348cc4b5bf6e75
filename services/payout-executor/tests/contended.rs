//! A contended account: the executor waits in the account's queue on lock-server instead of polling.
//! Another holder keeps `account:<id>` while a payout of that account is pending; the executor
//! (a long-running one, a 500 ms poll interval) must wait for the lock — its waits show in
//! lock-server's `lock_wait_total` — and never ask with a no-wait acquire that comes back 409
//! (`lock_acquire_total{result="contended"}` stays 0: no polling). When the holder releases, the
//! executor is woken and the payout ends POSTED. Real processes over real PostgreSQL 16.
//!
//! Binaries come from the workspace build (see tests/proof.rs).

use std::time::Duration;

use dlock_client::LockClient;
use dlock_testkit::stack::{Stack, StackOptions};
use dlock_testkit::wait::eventually;
use payout_executor::model::PayoutState;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_worker_waits_in_the_accounts_queue_instead_of_polling() {
    let lockdb = dlock_testkit::lockdb().await;
    let paydb = dlock_testkit::paydb().await;
    let dir = std::env::temp_dir().join(format!("payout-contended-{}", std::process::id()));
    let opts = StackOptions::new(&dir);
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts)
        .await
        .unwrap_or_else(|e| panic!("start the stack (logs in {}): {e:#}", dir.display()));
    let account = stack.create_account("EUR", 10_000).await.unwrap();
    let payout = stack.create_payout(account, 300, "EUR").await.unwrap();
    let key = format!("account:{account}");

    // Another holder has the account.
    let client = LockClient::new(&stack.lock_url).unwrap();
    let session = client
        .open_session("other-holder", Duration::from_secs(60))
        .await
        .unwrap();
    let lock = session.try_acquire(&key, Duration::from_secs(60)).await.unwrap();

    let spec = stack.service_executor_spec("waiting-executor").unwrap().args([
        "--poll-interval-ms",
        "500",
        "--acquire-wait-ms",
        "200",
    ]);
    let executor = stack.start_executor(spec).await.unwrap();
    let stack = &stack;
    let metric = |name: &'static str, labels: &'static [(&'static str, &'static str)]| async move {
        stack.metric(&stack.lock_url, name, labels).await.unwrap()
    };
    // The executor waited, and its waits ended, more than once while the account stayed held.
    eventually("the executor to wait out two waits", LIMIT, || async move {
        (metric("lock_wait_total", &[("result", "contended")]).await >= 2.0).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        stack.payout(payout.payout_id).await.unwrap().state,
        PayoutState::Pending
    );
    assert_eq!(
        metric("lock_acquire_total", &[("result", "contended")]).await,
        0.0,
        "a no-wait acquire answered 409: the executor polled"
    );

    // Released: the waiting executor is woken and pays.
    eventually("the executor to wait again", LIMIT, || async move {
        (metric("lock_waiting", &[]).await >= 1.0).then_some(())
    })
    .await
    .unwrap();
    lock.release().await.unwrap();
    let posted = eventually("the payout to be posted", LIMIT, || async move {
        stack
            .payout(payout.payout_id)
            .await
            .ok()
            .filter(|p| p.state == PayoutState::Posted)
    })
    .await;
    assert!(posted.is_ok(), "{:?}", stack.payout(payout.payout_id).await);
    assert!(metric("lock_wait_total", &[("result", "granted")]).await >= 1.0);
    assert_eq!(
        metric("lock_acquire_total", &[("result", "contended")]).await,
        0.0
    );
    session.close().await.unwrap();
    drop(executor);
    let _ = std::fs::remove_dir_all(&dir);
}
