//! dlock-client against the real lock-server (in-process, ephemeral port) over a real PostgreSQL 16
//! lockdb. Every wait is on a condition or a notification, with a deadline.

mod common;

use std::time::Duration;

use common::*;
use dlock_client::{ClientError, LockState, LossReason, ReleaseOutcome};
use tokio::time::Instant;

const SHORT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_renewal_keeps_the_lock_past_several_ttls() {
    let env = Env::start().await;
    let s1 = env.session("worker-1").await;
    let s2 = env.session("worker-2").await;
    let lease = Duration::from_millis(600);
    let h1 = s1
        .acquire("account:renew", lease, Duration::ZERO)
        .await
        .expect("granted");
    let acquired_at = h1.acquired_at();
    assert_eq!(h1.key(), "account:renew");
    assert_eq!(h1.owner_id(), "worker-1");
    assert_eq!(h1.session_id(), s1.id());

    // Held until the server's own record shows the lease extended past five TTLs — which only
    // background renewals can do. Meanwhile nobody else gets it and the token never changes.
    wait_until("the lease to be renewed past 5 TTLs", || async {
        let status = env.client.lock_status("account:renew").await.expect("status");
        assert_eq!(status.state, LockState::Held);
        assert_eq!(status.fencing_token, Some(h1.token()));
        assert!(matches!(
            s2.try_acquire("account:renew", lease).await,
            Err(ClientError::Contended { .. })
        ));
        assert!(
            h1.ensure_held().is_ok(),
            "lost while renewing: {:?}",
            h1.loss_reason()
        );
        let held_for = status.expires_at.expect("expiry") - acquired_at;
        held_for > chrono::Duration::from_std(lease * 5).expect("duration")
    })
    .await;
    assert!(h1.expires_at() > acquired_at + chrono::Duration::from_std(lease * 4).expect("duration"));
    assert!(h1.valid_until() > Instant::now());

    assert_eq!(h1.release().await.expect("release"), ReleaseOutcome::Released);
    assert_eq!(env.holder_token("account:renew").await, None);
    assert_eq!(env.lock_rows().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_wait_returns_contended_while_another_holder_keeps_the_lock() {
    let env = Env::start().await;
    let s1 = env.session("holder").await;
    let s2 = env.session("waiter").await;
    let h1 = s1
        .acquire("account:busy", LONG, Duration::ZERO)
        .await
        .expect("granted");

    let max_wait = Duration::from_millis(400);
    let started = Instant::now();
    let err = s2
        .acquire("account:busy", LONG, max_wait)
        .await
        .expect_err("must not be granted");
    assert!(
        matches!(&err, ClientError::Contended { key } if key == "account:busy"),
        "{err}"
    );
    assert!(!err.is_terminal());
    // It did wait, in the key's queue on the server, rather than giving up at once (and never
    // polled with no-wait acquires).
    assert!(started.elapsed() >= max_wait);
    assert!(env.metric("lock_wait_total{result=\"contended\"}").await >= 1);
    assert_eq!(env.metric("lock_acquire_total{result=\"contended\"}").await, 0);

    // try_acquire does not wait at all.
    assert!(matches!(
        s2.try_acquire("account:busy", LONG).await,
        Err(ClientError::Contended { .. })
    ));
    assert_eq!(env.holder_token("account:busy").await, Some(h1.token()));
    assert!(h1.ensure_held().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_wait_succeeds_when_the_holder_releases_during_the_wait() {
    let env = Env::start().await;
    let s1 = env.session("holder").await;
    let s2 = env.session("waiter").await;
    let h1 = s1
        .acquire("account:handover", LONG, Duration::ZERO)
        .await
        .expect("granted");
    let t1 = h1.token();

    let waiter = tokio::spawn(async move {
        let h2 = s2.acquire("account:handover", LONG, WAIT_LIMIT).await;
        (s2, h2)
    });
    // Release only once the waiter is really asleep in the key's queue.
    wait_until("the waiter to be queued", || async {
        env.metric("lock_waiting").await == 1
    })
    .await;
    assert!(!waiter.is_finished());
    assert_eq!(h1.release().await.expect("release"), ReleaseOutcome::Released);

    let (_s2, h2) = within("the waiter to be granted", waiter).await.expect("join");
    let h2 = h2.expect("granted after the release");
    assert!(h2.token() > t1, "{} must be > {t1}", h2.token());
    assert_eq!(env.holder_token("account:handover").await, Some(h2.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_told_it_lost_the_lock_when_it_is_taken_over() {
    let env = Env::start().await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:pause", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let lost = h1.lost_token();

    let h2 = pause_and_takeover(&env, h1, &s2, "account:pause")
        .await
        .expect("the invariant holds with the real client");
    assert!(lost.is_cancelled(), "the handed-out loss token fired too");
    // The successor keeps renewing its own lease.
    assert!(h2.ensure_held().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_details_of_a_paused_holder() {
    let env = Env::start().await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:pause2", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    h1.suspend_renewal();
    let reason = within("the loss notification", h1.lost()).await;
    assert_eq!(reason, LossReason::RenewalUnconfirmed);
    let h2 = s2
        .acquire("account:pause2", LONG, WAIT_LIMIT)
        .await
        .expect("taken over");
    match h1.ensure_held() {
        Err(e @ ClientError::LockLost { .. }) => {
            assert!(e.is_terminal());
            let ClientError::LockLost { key, token, reason } = e else {
                unreachable!()
            };
            assert_eq!(key, "account:pause2");
            assert_eq!(token, h1.token());
            assert_eq!(reason, LossReason::RenewalUnconfirmed);
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
    // Waking up does not bring it back.
    h1.resume_renewal();
    assert!(h1.is_lost());
    assert_eq!(h1.release().await.expect("release"), ReleaseOutcome::Stale);
    assert_eq!(env.holder_token("account:pause2").await, Some(h2.token()));
    // The session itself is fine: only that lease was lost.
    assert!(s1.check().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_answered_lease_expired_fires_lost_at_once() {
    let env = Env::start().await;
    let s1 = env.session("worker-1").await;
    let s2 = env.session("worker-2").await;
    // A long lease that is renewing normally: only the server can take it away.
    let h1 = s1
        .acquire("account:revoked", Duration::from_millis(900), Duration::ZERO)
        .await
        .expect("granted");
    env.revoke("account:revoked").await;
    let h2 = s2
        .acquire("account:revoked", LONG, Duration::ZERO)
        .await
        .expect("free after the revoke");
    assert!(h2.token() > h1.token());

    let reason = within("the loss notification", h1.lost()).await;
    assert_eq!(reason, LossReason::LeaseExpired);
    assert!(matches!(
        h1.ensure_held(),
        Err(ClientError::LockLost {
            reason: LossReason::LeaseExpired,
            ..
        })
    ));
    assert_eq!(h1.release().await.expect("release"), ReleaseOutcome::Stale);
    assert_eq!(env.holder_token("account:revoked").await, Some(h2.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_server_side_voids_its_handles() {
    let env = Env::start().await;
    // Heartbeats every 200 ms; the lease itself is long, so only the session can void it.
    let s1 = env
        .client
        .open_session("worker-1", Duration::from_millis(600))
        .await
        .expect("session");
    let s2 = env.session("worker-2").await;
    let a = s1.acquire("account:a", LONG, Duration::ZERO).await.expect("a");
    let b = s1.acquire("account:b", LONG, Duration::ZERO).await.expect("b");

    // Someone else closes it (as an operator or the reaper would remove it).
    let closed = env.client.api().close_session(s1.id()).await.expect("close");
    assert!(closed.closed);

    assert_eq!(within("session loss", s1.lost()).await, LossReason::SessionGone);
    for h in [&a, &b] {
        assert_eq!(within("handle loss", h.lost()).await, LossReason::SessionGone);
        assert!(matches!(
            h.ensure_held(),
            Err(ClientError::LockLost {
                reason: LossReason::SessionGone,
                ..
            })
        ));
    }
    assert!(matches!(
        s1.try_acquire("account:c", LONG).await,
        Err(ClientError::SessionGone { .. })
    ));
    // The cascade released both locks: another session gets them at once, with newer tokens.
    let a2 = s2
        .acquire("account:a", LONG, Duration::ZERO)
        .await
        .expect("a is free");
    assert!(a2.token() > b.token());
    assert_eq!(a.release().await.expect("release"), ReleaseOutcome::Stale);
    // Closing what is already gone says so.
    assert!(!s1.close().await.expect("close"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_heartbeats_stop_is_lost_reaped_and_its_locks_freed() {
    let env = Env::start().await;
    let s1 = env.client.open_session("worker-1", SHORT).await.expect("session");
    let s2 = env.session("worker-2").await;
    let h1 = s1
        .acquire("account:reaped", LONG, Duration::ZERO)
        .await
        .expect("granted");
    s1.suspend_heartbeat();

    assert_eq!(
        within("session loss", s1.lost()).await,
        LossReason::HeartbeatUnconfirmed
    );
    assert_eq!(
        within("handle loss", h1.lost()).await,
        LossReason::HeartbeatUnconfirmed
    );
    assert!(h1.is_lost());
    // The server's reaper removes the expired session; the cascade frees the key.
    let h2 = s2
        .acquire("account:reaped", LONG, WAIT_LIMIT)
        .await
        .expect("free after the reap");
    assert!(h2.token() > h1.token());
    // A heartbeat now would find the session gone: resuming changes nothing locally either.
    s1.resume_heartbeat();
    assert!(s1.is_lost());
    assert!(matches!(
        env.client.api().heartbeat(s1.id(), 1000).await,
        Err(ClientError::SessionGone { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_or_closing_the_session_voids_handles() {
    let env = Env::start().await;
    let s1 = env.session("worker-1").await;
    let h1 = s1
        .acquire("account:dropped", LONG, Duration::ZERO)
        .await
        .expect("granted");
    drop(s1);
    assert_eq!(within("handle loss", h1.lost()).await, LossReason::SessionEnded);
    assert!(h1.ensure_held().is_err());

    let s2 = env.session("worker-2").await;
    let h2 = s2
        .acquire("account:closed", LONG, Duration::ZERO)
        .await
        .expect("granted");
    assert!(s2.close().await.expect("close"));
    assert_eq!(h2.loss_reason(), Some(LossReason::SessionEnded));
    // The cascade released the lock server-side.
    assert_eq!(env.holder_token("account:closed").await, None);
    assert_eq!(
        env.session_rows().await,
        1,
        "only the dropped session remains until it is reaped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_handle_stops_renewal_and_the_lease_lapses() {
    let env = Env::start().await;
    let s1 = env.session("worker-1").await;
    let s2 = env.session("worker-2").await;
    let h1 = s1
        .acquire("account:lapse", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let t1 = h1.token();
    let lost = h1.lost_token();
    drop(h1);
    assert!(lost.is_cancelled(), "tasks watching the handle are told at once");
    // No release was sent, so the key frees only when the unrenewed lease lapses.
    assert_eq!(env.holder_token("account:lapse").await, Some(t1));
    let h2 = s2
        .acquire("account:lapse", LONG, WAIT_LIMIT)
        .await
        .expect("lapsed");
    assert!(h2.token() > t1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_out_of_reach_means_the_lock_is_lost_by_its_deadline() {
    let db = dlock_testkit::lockdb().await;
    let server = lock_server::spawn(lock_server::Config::new(db.app_url()))
        .await
        .expect("lock-server starts");
    let client = dlock_client::LockClient::new(&server.base_url()).expect("client");
    let s1 = client.open_session("worker-1", LONG).await.expect("session");
    let h1 = s1
        .acquire("account:partition", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    // Take the server away: renewals can no longer be confirmed.
    server.shutdown().await.expect("shutdown");
    let reason = within("the loss notification", h1.lost()).await;
    assert_eq!(reason, LossReason::RenewalUnconfirmed);
    assert!(
        Instant::now() >= h1.valid_until(),
        "declared lost only once the deadline had passed"
    );
    assert!(h1.is_lost());
    // The session's own deadline is far away: it is not lost (yet).
    assert!(s1.check().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_keys_sessions_and_reentry() {
    let env = Env::start().await;
    let s1 = env.session("worker-1").await;
    let s2 = env.session("worker-2").await;
    let mut tokens = Vec::new();

    // Renewing every 300 ms, so that it soon finds out about the re-entry below.
    let a = s1
        .acquire("account:x", Duration::from_millis(900), Duration::ZERO)
        .await
        .expect("x");
    tokens.push(a.token());
    let b = s2.acquire("account:y", LONG, Duration::ZERO).await.expect("y");
    tokens.push(b.token());
    // Re-entry from the same session: a new, higher token, and the older handle loses its lease.
    let a_again = s1
        .acquire("account:x", LONG, Duration::ZERO)
        .await
        .expect("re-entry");
    tokens.push(a_again.token());
    assert_eq!(
        within("the re-entered handle's loss", a.lost()).await,
        LossReason::LeaseExpired
    );
    assert_eq!(a.release().await.expect("stale"), ReleaseOutcome::Stale);
    // Release and acquire again: the counter does not live on the row.
    assert_eq!(
        a_again.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let c = s2
        .acquire("account:x", LONG, Duration::ZERO)
        .await
        .expect("x again");
    tokens.push(c.token());
    // A takeover of a lapsed lease.
    let short = s1.acquire("account:z", SHORT, Duration::ZERO).await.expect("z");
    tokens.push(short.token());
    short.suspend_renewal();
    let taken = s2
        .acquire("account:z", LONG, WAIT_LIMIT)
        .await
        .expect("z taken over");
    tokens.push(taken.token());

    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_anything_is_sent() {
    let env = Env::start().await;
    let sessions_before = env.session_rows().await;
    for (owner, ttl, code) in [
        ("", LONG, "INVALID_OWNER_ID"),
        (" padded", LONG, "INVALID_OWNER_ID"),
        ("worker", Duration::from_millis(9), "INVALID_TTL"),
        ("worker", Duration::from_micros(9_999), "INVALID_TTL"),
        ("worker", Duration::from_secs(86_401), "INVALID_TTL"),
    ] {
        match env.client.open_session(owner, ttl).await {
            Err(ClientError::InvalidArgument { code: c, .. }) => assert_eq!(c, code, "{owner:?} {ttl:?}"),
            other => panic!("{owner:?} {ttl:?}: expected {code}, got {other:?}"),
        }
    }
    assert_eq!(
        env.session_rows().await,
        sessions_before,
        "no session was written"
    );

    let s = env.session("worker").await;
    let long_key = "k".repeat(257);
    for (key, ttl, code) in [
        ("", LONG, "INVALID_LOCK_KEY"),
        (long_key.as_str(), LONG, "INVALID_LOCK_KEY"),
        ("a\nb", LONG, "INVALID_LOCK_KEY"),
        ("account:1", Duration::ZERO, "INVALID_TTL"),
    ] {
        match s.acquire(key, ttl, Duration::from_secs(1)).await {
            Err(ClientError::InvalidArgument { code: c, .. }) => assert_eq!(c, code, "{key:?}"),
            other => panic!("{key:?}: expected {code}, got {other:?}"),
        }
    }
    assert_eq!(env.lock_rows().await, 0, "no lock was written");
    assert!(matches!(
        dlock_client::LockClient::new("not a url"),
        Err(ClientError::InvalidArgument {
            code: "INVALID_BASE_URL",
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_slashes_and_spaces_round_trip() {
    let env = Env::start().await;
    let s = env.session("worker").await;
    let key = "tenant/7 account:9%";
    let h = s.acquire(key, LONG, Duration::ZERO).await.expect("granted");
    assert_eq!(h.key(), key);
    assert_eq!(env.holder_token(key).await, Some(h.token()));
    let stored: String = sqlx::query_scalar("SELECT lock_key FROM lock_entry")
        .fetch_one(env.admin())
        .await
        .expect("row");
    assert_eq!(stored, key);
    assert_eq!(h.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A stand-in protected resource: one account whose fence is 9, enforcing `fence < token` the way
/// statement (a) does, answering refusals with dlock-common's error body.
async fn fake_account_resource() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use axum::http::HeaderMap;
    use dlock_common::fencing::FENCED_OUT;
    use dlock_common::{ApiError, FencingToken};

    async fn debit(headers: HeaderMap) -> Result<&'static str, ApiError> {
        let token = FencingToken::from_headers(&headers)?;
        const FENCE: i64 = 9;
        if token.get() <= FENCE {
            return Err(
                ApiError::conflict(FENCED_OUT, "a newer holder already wrote this account")
                    .with("presented", token.get())
                    .with("highest", FENCE)
                    .with("resourceType", "account")
                    .with("resourceId", "acc-1")
                    .with("ownerId", "worker-1"),
            );
        }
        Ok("ok")
    }
    let app = axum::Router::new().route("/debit", axum::routing::post(debit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

#[tokio::test]
async fn a_fenced_out_answer_from_a_protected_resource_becomes_the_terminal_error() {
    let (addr, server) = fake_account_resource().await;
    let http = reqwest::Client::new();
    let post = |token: &str| {
        http.post(format!("http://{addr}/debit"))
            .header(dlock_common::FENCING_TOKEN_HEADER, token)
            .send()
    };

    let stale = post("7").await.expect("answer");
    assert_eq!(stale.status(), 409);
    match dlock_client::error_from_response(stale).await {
        ClientError::FencedOut(f) => {
            assert_eq!(f.presented(), 7);
            assert_eq!(f.highest(), 9);
            assert_eq!(f.resource_type(), "account");
            assert_eq!(f.resource_id(), "acc-1");
            assert_eq!(f.owner_id(), "worker-1");
            assert!(ClientError::FencedOut(f).is_terminal());
        }
        other => panic!("expected FencedOut, got {other:?}"),
    }
    // Equality loses too.
    let equal = post("9").await.expect("answer");
    assert!(matches!(
        dlock_client::error_from_response(equal).await,
        ClientError::FencedOut(f) if f.presented() == 9
    ));
    // A bad token is a plain, non-terminal API error — never read as 0 and fenced out.
    let bad = post("0").await.expect("answer");
    let e = dlock_client::error_from_response(bad).await;
    assert!(
        matches!(&e, ClientError::Api { status, code, .. } if *status == 400 && code == "INVALID_TOKEN"),
        "{e:?}"
    );
    assert!(!e.is_terminal());
    assert_eq!(post("10").await.expect("answer").status(), 200);
    server.abort();
}

/// The handle carries the grant lock-server signed for its token, and presents it with the token
/// (`fence`); a renewal brings the grant signed again — after a key rotation (a new lock-server on
/// the same lockdb and port, with a new key, as a rolled pod would be), with the new key — and the
/// lock is held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handle_carries_its_signed_grant_and_a_renewal_brings_the_new_key() {
    use dlock_grant::{KeyId, PublicKeys, SigningKey};
    let db = dlock_testkit::lockdb().await;
    let (k1, k2) = (
        SigningKey::generate(KeyId::new("k1").unwrap()),
        SigningKey::generate(KeyId::new("k2").unwrap()),
    );
    let trust = |k: &SigningKey| PublicKeys::new(vec![k.public_key()]).unwrap();
    let config = |key: &SigningKey| {
        lock_server::Config::new(db.app_url())
            .with_reaper_interval(None)
            .with_lock_service_id("tests/locks")
            .with_signing_key(Some(key.clone()))
    };
    let first = lock_server::spawn(config(&k1)).await.unwrap();
    let addr = first.addr();
    let client = dlock_client::LockClient::new(&first.base_url()).unwrap();
    let session = client.open_session("holder", LONG).await.unwrap();
    let key = format!("account:{}", uuid::Uuid::new_v4());
    let lock = session
        .acquire(&key, Duration::from_secs(3), Duration::from_secs(1))
        .await
        .unwrap();
    let token = lock.token();
    let signed = trust(&k1).verify(&lock.grant().expect("a signed grant")).unwrap();
    assert_eq!(
        (
            signed.lock_key.as_str(),
            signed.token,
            signed.owner_id.as_str(),
            signed.session_id
        ),
        (key.as_str(), token.get(), "holder", session.id())
    );
    assert_eq!(
        lock.fence(),
        dlock_client::Fence {
            token,
            grant: lock.grant()
        }
    );

    first.shutdown().await.unwrap();
    let second = lock_server::spawn(config(&k2).with_listen(addr)).await.unwrap();
    let resigned = dlock_testkit::wait::eventually(
        "a renewal to bring the grant signed with k2",
        WAIT_LIMIT,
        || async { trust(&k2).verify(&lock.grant()?).ok() },
    )
    .await
    .unwrap();
    assert_eq!(
        (resigned.token, resigned.lock_key.as_str()),
        (token.get(), key.as_str())
    );
    assert!(!lock.is_lost(), "{:?}", lock.loss_reason());
    lock.release().await.unwrap();
    session.close().await.unwrap();
    second.shutdown().await.unwrap();
}

/// `LockHandle::reenter` (what the executor does between two payouts of one account): a newer
/// token in the same session, the key never free in between — a waiter in its queue is granted
/// only after the final release — and the old handle void.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reenter_hands_a_newer_token_and_nobody_comes_in_between() {
    let env = Env::start().await;
    let s1 = env.session("visitor").await;
    let s2 = env.session("waiter").await;
    let first = s1
        .acquire("account:visit", LONG, Duration::ZERO)
        .await
        .expect("granted");
    let t1 = first.token();
    // Waiting in the key's queue from before the re-entries on.
    let waiting = tokio::spawn(async move {
        let h = s2
            .acquire("account:visit", LONG, Duration::from_secs(30))
            .await
            .expect("granted after the release");
        (h.token(), s2, h)
    });
    let mut h = first;
    let mut tokens = vec![t1];
    for _ in 0..3 {
        h = h.reenter().await.expect("re-entered");
        assert_eq!(env.holder_token("account:visit").await, Some(h.token()));
        tokens.push(h.token());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(!waiting.is_finished(), "the waiter came in between");
    let last = h.token();
    assert_eq!(h.release().await.expect("release"), ReleaseOutcome::Released);
    let (theirs, _s2, _h2) = within("the waiter's grant", waiting).await.expect("task");
    assert!(theirs > last, "{theirs} after {last}");
}

/// A re-entry after the lease lapsed and another holder took the key: contended, and the new
/// holder keeps it (the old token's release inside `reenter` deletes nothing of theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reenter_after_a_takeover_is_contended_and_leaves_the_new_holder_alone() {
    let env = Env::start().await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h = s1
        .acquire("account:lapsed", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    h.suspend_renewal();
    let theirs = s2
        .acquire("account:lapsed", LONG, Duration::from_secs(30))
        .await
        .expect("taken over");
    match h.reenter().await {
        Err(ClientError::Contended { .. }) => {}
        other => panic!("expected Contended, got {other:?}"),
    }
    assert_eq!(env.holder_token("account:lapsed").await, Some(theirs.token()));
    assert!(theirs.ensure_held().is_ok());
}
