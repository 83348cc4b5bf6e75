//! The HTTP hop alone: a stand-in for lock-server that answers the routes a bench cycle uses
//! (open a session, acquire, release) with the same wire types and the same serving code
//! ([`dlock_common::serve::run_until`]), and does nothing else — no store, no signature, no batch,
//! no metrics. `dlock-dev bench lock` runs it as a process of its own (`dlock-dev bench hop-server`) and
//! drives it with the same client and loop as the lock-server rows, so its row is what one cycle's
//! two HTTP requests cost on this machine, generator and server: a floor under every dlock row,
//! whatever the store. (It allocates with glibc's allocator, lock-server with mimalloc: if anything,
//! its server part reads high.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use anyhow::{Context, Result};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{Duration, Utc};
use clap::Args;
use dlock_common::FencingToken;
use dlock_wire::lock::{AcquireRequest, CreateSessionRequest, LockGrant, LockReleased, SessionCreated};
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct HopServerArgs {
    /// Address to serve on.
    #[arg(long)]
    listen: SocketAddr,
}

/// Serves until the process is stopped.
pub async fn serve(args: HopServerArgs) -> Result<bool> {
    let listener = dlock_common::serve::bind(args.listen)
        .await
        .with_context(|| format!("bind {}", args.listen))?;
    dlock_common::serve::run_until(listener, app(), std::future::pending())
        .await
        .context("serve")?;
    Ok(true)
}

/// The last token handed out: tokens still increase, so a client's checks of a grant hold.
type Tokens = Arc<AtomicI64>;

fn app() -> Router {
    Router::new()
        .route("/v1/sessions", post(open_session))
        .route("/v1/locks/{key}/acquire", post(acquire))
        .route("/v1/locks/{key}/release", post(release))
        .route("/readyz", get(dlock_common::serve::healthz))
        .with_state(Tokens::default())
}

async fn open_session(Json(req): Json<CreateSessionRequest>) -> (StatusCode, Json<SessionCreated>) {
    let created = SessionCreated {
        session_id: Uuid::new_v4(),
        owner_id: req.owner_id,
        expires_at: Utc::now() + Duration::milliseconds(req.ttl_ms),
    };
    (StatusCode::CREATED, Json(created))
}

async fn acquire(
    State(tokens): State<Tokens>,
    Path(key): Path<String>,
    Json(req): Json<AcquireRequest>,
) -> Result<Json<LockGrant>, StatusCode> {
    let token = FencingToken::new(tokens.fetch_add(1, Ordering::Relaxed) + 1)
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let now = Utc::now();
    Ok(Json(LockGrant {
        lock_key: key,
        fencing_token: token,
        owner_id: req.owner_id,
        session_id: req.session_id,
        acquired_at: now,
        expires_at: now + Duration::milliseconds(req.ttl_ms),
        grant: None,
    }))
}

async fn release(Path(key): Path<String>, headers: HeaderMap) -> Result<Json<LockReleased>, StatusCode> {
    let token = FencingToken::from_headers(&headers).map_err(|_| StatusCode::BAD_REQUEST)?;
    Ok(Json(LockReleased {
        lock_key: key,
        fencing_token: token,
        released: true,
        stale: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_client::{ClientConfig, LockApi};

    /// The stand-in answers the bench's cycle through the real client: a session, a grant with a
    /// token above the last one, a release that is not stale.
    #[tokio::test]
    async fn the_client_runs_a_bench_cycle_against_the_stand_in() {
        let listener = dlock_common::serve::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(dlock_common::serve::run_until(
            listener,
            app(),
            std::future::pending(),
        ));
        let api = LockApi::new(&format!("http://{addr}"), &ClientConfig::default()).unwrap();
        let session = api.open_session("hop-test", 60_000).await.unwrap().session_id;
        let first = api.acquire("hop:1", session, "hop-test", 1_000).await.unwrap();
        let second = api.acquire("hop:1", session, "hop-test", 1_000).await.unwrap();
        assert!(second.fencing_token > first.fencing_token);
        assert_eq!(second.session_id, session);
        let released = api.release("hop:1", second.fencing_token).await.unwrap();
        assert!(released.released && !released.stale);
        assert_eq!(released.fencing_token, second.fencing_token);
    }
}
