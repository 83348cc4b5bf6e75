//! Shared test set-up: a real lock-server in this process, on an ephemeral port, over a fresh real
//! PostgreSQL 16 lockdb (as role lockapp), plus waits with deadlines and the safety scenarios that
//! both the normal tests and the negative controls run.
//!
//! A scenario returns `Err(violation)` when its invariant does not hold: the normal tests assert
//! `Ok`, the negative controls run it against a deliberately broken variant and assert `Err`.

#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::time::Duration;

use dlock_client::api::LockGrant;
use dlock_client::{
    ClientConfig, ClientError, FencingToken, LockApi, LockClient, LockHandle, LockState, ReleaseOutcome,
    Session,
};
use dlock_testkit::TestDb;
use dlock_testkit::etcd::EtcdCluster;
use lock_server::{Backend, Config, EtcdFaults, EtcdRepo, RunningServer, Statements};
use sqlx::PgPool;

pub const ADMIN_TOKEN: &str = "client-tests-admin-token";
/// Long enough never to lapse during a test.
pub const LONG: Duration = Duration::from_secs(60);
pub use dlock_testkit::wait::WAIT_LIMIT;

pub struct Env {
    /// lockdb, when the server runs the PostgreSQL backend.
    pub db: Option<TestDb>,
    /// As postgres, for inspection only (PostgreSQL backend).
    pub admin: Option<PgPool>,
    /// The etcd member, when the server runs the etcd backend.
    pub etcd: Option<EtcdCluster>,
    pub server: RunningServer,
    pub client: LockClient,
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(Statements::C1).await
    }

    /// A server running `stmts` (a broken set only in negative controls).
    pub async fn start_with(stmts: Statements) -> Env {
        let db = dlock_testkit::lockdb().await;
        let admin = db.admin_pool().await;
        let config = Config::new(db.app_url())
            .with_admin_token(ADMIN_TOKEN)
            .with_reaper_interval(Some(Duration::from_millis(50)));
        let server = lock_server::spawn_with_statements(config, stmts)
            .await
            .expect("lock-server starts");
        let client = LockClient::new(&server.base_url()).expect("client");
        Env {
            db: Some(db),
            admin: Some(admin),
            etcd: None,
            server,
            client,
        }
    }

    /// The same server over the etcd backend (one real etcd member), `faults` only in negative
    /// controls.
    pub async fn start_etcd(faults: EtcdFaults) -> Env {
        let etcd = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd)");
        let repo = EtcdRepo::connect(&etcd.endpoints(), "/dlock/")
            .await
            .expect("etcd client");
        let repo = EtcdRepo::with_client(repo.client(), "/dlock/", faults);
        let config = Config::etcd(etcd.endpoints(), "/dlock/")
            .with_admin_token(ADMIN_TOKEN)
            .with_reaper_interval(Some(Duration::from_millis(50)));
        let server = lock_server::spawn_with_backend(config, Backend::Etcd(repo))
            .await
            .expect("lock-server starts");
        let client = LockClient::new(&server.base_url()).expect("client");
        Env {
            db: None,
            admin: None,
            etcd: Some(etcd),
            server,
            client,
        }
    }

    /// lockdb as postgres (PostgreSQL-backend tests only).
    pub fn admin(&self) -> &PgPool {
        self.admin.as_ref().expect("a PostgreSQL-backend test")
    }

    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    pub async fn session(&self, owner: &str) -> Session {
        self.client
            .open_session(owner, LONG)
            .await
            .expect("session opens")
    }

    /// The key's current token as the server sees it, if held (live).
    pub async fn holder_token(&self, key: &str) -> Option<FencingToken> {
        let status = self.client.lock_status(key).await.expect("status");
        match status.state {
            LockState::Held => status.fencing_token,
            LockState::Free | LockState::Expired => None,
        }
    }

    /// `POST /v1/admin/locks/{key}/revoke`, as an operator would.
    pub async fn revoke(&self, key: &str) {
        let mut url = reqwest::Url::parse(&self.base_url()).expect("url");
        url.path_segments_mut()
            .expect("base")
            .extend(["v1", "admin", "locks", key, "revoke"]);
        let response = reqwest::Client::new()
            .post(url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"operator": "tests", "reason": "simulated takeover"}))
            .send()
            .await
            .expect("revoke request");
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }

    /// The server's counter line `name{labels}` from `/metrics` (0 if absent).
    pub async fn metric(&self, series: &str) -> u64 {
        let text = dlock_testkit::metrics::scrape(&self.base_url())
            .await
            .expect("metrics");
        dlock_testkit::metrics::counter(&text, series).unwrap_or(0)
    }

    pub async fn session_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM lock_session")
            .fetch_one(self.admin())
            .await
            .expect("count")
    }

    pub async fn lock_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM lock_entry")
            .fetch_one(self.admin())
            .await
            .expect("count")
    }
}

// Not every test file that includes this module waits.
#[allow(unused_imports)]
pub use dlock_testkit::wait::{wait_until, within};

// ---- the pause-and-takeover scenario -----------------------------------------------------------

/// The first holder of the pause-and-takeover scenario: the real [`LockHandle`], or a broken
/// stand-in from the negative controls.
pub trait FirstHolder {
    fn token(&self) -> FencingToken;
    /// Simulates the pause: no more renewals.
    fn pause(&self);
    /// Whether, checked right now, it would still let its critical section write.
    fn believes_held(&self) -> bool;
    /// Whether it was told it lost the lock (its loss notification fired).
    fn was_told(&self) -> impl Future<Output = bool>;
    fn release(self) -> impl Future<Output = Result<ReleaseOutcome, ClientError>>;
}

impl FirstHolder for LockHandle {
    fn token(&self) -> FencingToken {
        LockHandle::token(self)
    }
    fn pause(&self) {
        self.suspend_renewal();
    }
    fn believes_held(&self) -> bool {
        self.ensure_held().is_ok()
    }
    async fn was_told(&self) -> bool {
        tokio::time::timeout(WAIT_LIMIT, self.lost()).await.is_ok()
    }
    async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        LockHandle::release(self).await
    }
}

/// A holder that trusts its grant until a server answer says otherwise — what a client without a
/// local deadline would be. Paused, it never hears anything.
pub struct NaiveHolder {
    pub api: LockApi,
    pub grant: LockGrant,
}

impl FirstHolder for NaiveHolder {
    fn token(&self) -> FencingToken {
        self.grant.fencing_token
    }
    fn pause(&self) {}
    fn believes_held(&self) -> bool {
        true
    }
    async fn was_told(&self) -> bool {
        false
    }
    async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        let r = self
            .api
            .release(&self.grant.lock_key, self.grant.fencing_token)
            .await?;
        Ok(if r.released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Stale
        })
    }
}

/// A naive first holder on `key`, through the raw API.
pub async fn naive_holder(env: &Env, session: &Session, key: &str, ttl: Duration) -> NaiveHolder {
    let api = LockApi::new(&env.base_url(), &ClientConfig::default()).expect("api");
    let grant = api
        .acquire(key, session.id(), session.owner_id(), ttl.as_millis() as i64)
        .await
        .expect("naive holder acquires");
    NaiveHolder { api, grant }
}

/// The first holder on `key` pauses past its lease; a second session takes the key over. Then:
/// the takeover token is strictly higher; the first holder no longer believes it holds the lock at
/// the moment the second is granted, and was told; its release afterwards is stale and leaves the
/// second holder's grant in place. Returns the second handle on success.
pub async fn pause_and_takeover(
    env: &Env,
    first: impl FirstHolder,
    second: &Session,
    key: &str,
) -> Result<LockHandle, String> {
    let t1 = first.token();
    first.pause();
    let h2 = second
        .acquire(key, LONG, WAIT_LIMIT)
        .await
        .map_err(|e| format!("the second holder could not take over: {e}"))?;
    // Checked right after the grant: the first holder's own deadline passed before the server's.
    if first.believes_held() {
        return Err(format!(
            "the paused first holder (token {t1}) still believes it holds {key} after token {} was granted",
            h2.token()
        ));
    }
    if h2.token() <= t1 {
        return Err(format!(
            "takeover token {} is not strictly higher than the paused holder's {t1}",
            h2.token()
        ));
    }
    if !first.was_told().await {
        return Err("the paused first holder was never told it lost the lock".into());
    }
    let outcome = first
        .release()
        .await
        .map_err(|e| format!("stale release failed: {e}"))?;
    let holder = env.holder_token(key).await;
    if outcome != ReleaseOutcome::Stale || holder != Some(h2.token()) {
        return Err(format!(
            "the stale holder's release was {outcome:?} and left holder {holder:?}, expected Stale and {}",
            h2.token()
        ));
    }
    h2.ensure_held()
        .map_err(|e| format!("the new holder lost the lock: {e}"))?;
    Ok(h2)
}
