//! lock-server's API as the actions use it: `GET /v1/locks/{key}` (who holds a key, with which
//! token), `GET /v1/sequence` (the last jump of the sequence; open) and the pinned revoke
//! `POST /v1/admin/locks/{key}/revoke`, the first and the last with the admin token the operator
//! generated (lock-server's clients file names only lock clients). The one write an
//! action makes outside Kubernetes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

use super::revoke::{LockView, RevokeAnswer, RevokeCall};
use super::sequence::SequenceView;
use crate::builders::Owner;
use crate::builders::credentials::{KEY_ADMIN_TOKEN, admin_secret_name};
use crate::context::Context;
use crate::error::{Error, Result};

/// lock-server's admin token, from the Secret the operator generated.
async fn admin_token(ctx: &Context, owner: &Owner) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = admin_secret_name(owner);
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| Error::step("read the lock-server admin Secret", e))?;
    secret
        .and_then(|s| s.data)
        .and_then(|d| d.get(KEY_ADMIN_TOKEN).cloned())
        .and_then(|v| String::from_utf8(v.0).ok())
        .filter(|t| !t.is_empty())
        .ok_or(Error::LockServer {
            step: "read the lock-server admin Secret",
            message: format!("Secret {name} has no key {KEY_ADMIN_TOKEN}"),
        })
}

fn lock_url(base: &str, segments: &[&str]) -> Result<url::Url> {
    let mut url = url::Url::parse(base).map_err(|e| Error::LockServer {
        step: "build the lock-server URL",
        message: e.to_string(),
    })?;
    url.path_segments_mut()
        .map_err(|()| Error::LockServer {
            step: "build the lock-server URL",
            message: format!("{base} cannot carry a path"),
        })?
        .extend(segments);
    Ok(url)
}

/// `GET /v1/locks/{key}`: the current holder and its fencing token. With the admin token: lock-server
/// always has a clients file (`builders::lock_clients`), and admits the admin, no client, to read
/// any key.
pub async fn get_lock(ctx: &Context, owner: &Owner, base: &str, key: &str) -> Result<LockView> {
    const STEP: &str = "read the current grant (GET /v1/locks/{key})";
    let token = admin_token(ctx, owner).await?;
    let url = lock_url(base, &["v1", "locks", key])?;
    let http = ctx.http_for(&owner.namespace, base).await?;
    send(STEP, http.get(url).bearer_auth(token)).await
}

/// How long the sequence read may take: it is only shown, so a slow lock-server must not hold the
/// reconcile up for the client's whole timeout.
const SEQUENCE_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /v1/sequence` (no credentials): the last jump of `fencing_token_seq` made by the replica
/// that answers.
pub async fn read_sequence(http: &reqwest::Client, base: &str) -> Result<SequenceView> {
    const STEP: &str = "read the sequence's last jump (GET /v1/sequence)";
    let url = lock_url(base, &["v1", "sequence"])?;
    send(STEP, http.get(url).timeout(SEQUENCE_TIMEOUT)).await
}

/// The pinned revoke: removes the grant only if it still carries `call.token`.
pub async fn revoke(ctx: &Context, owner: &Owner, base: &str, call: &RevokeCall) -> Result<RevokeAnswer> {
    const STEP: &str = "revoke the recorded token (POST /v1/admin/locks/{key}/revoke)";
    let token = admin_token(ctx, owner).await?;
    let url = lock_url(base, &["v1", "admin", "locks", &call.key, "revoke"])?;
    let body = json!({
        "operator": call.requested_by,
        "reason": call.reason,
        "requestId": call.id,
        "fencingToken": call.token,
    });
    let http = ctx.http_for(&owner.namespace, base).await?;
    send(STEP, http.post(url).bearer_auth(token).json(&body)).await
}

/// Sends one request to lock-server and reads its JSON answer; any failure names `step`.
async fn send<T: serde::de::DeserializeOwned>(step: &'static str, req: reqwest::RequestBuilder) -> Result<T> {
    let resp = req.send().await.map_err(|e| Error::LockServer {
        step,
        message: e.to_string(),
    })?;
    decode(step, resp).await
}

async fn decode<T: serde::de::DeserializeOwned>(step: &'static str, resp: reqwest::Response) -> Result<T> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| Error::LockServer {
        step,
        message: e.to_string(),
    })?;
    if !status.is_success() {
        // lock-server's errors are {code, message}; never echo anything that could hold a secret.
        let short: String = text.chars().take(300).collect();
        return Err(Error::LockServer {
            step,
            message: format!("HTTP {status}: {short}"),
        });
    }
    serde_json::from_str(&text).map_err(|e| Error::LockServer {
        step,
        message: format!("unexpected answer: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::get;

    use super::*;
    use crate::crd::sequence::JumpCause;

    /// A stand-in lock-server on loopback answering `GET /v1/sequence` with `answer`.
    async fn serve(answer: (StatusCode, &'static str)) -> String {
        let app = Router::new().route("/v1/sequence", get(move || async move { answer }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn http() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    #[tokio::test]
    async fn the_sequence_is_read_over_http_and_a_failure_is_an_error_not_a_panic() {
        let body = r#"{"backend":"postgres","jumpsEnabled":true,"lastJump":{"at":"2026-03-01T10:00:00.5Z","cause":"postmaster_restart","found":7,"jumpedTo":4294967303,"systemIdentifier":"73","timeline":1,"postmasterStarted":"2026-03-01T09:59:58Z"}}"#;
        let base = serve((StatusCode::OK, body)).await;
        let v = read_sequence(&http(), &base).await.unwrap();
        let j = v.last_jump.unwrap();
        assert_eq!(
            (j.cause, j.found, j.jumped_to),
            (JumpCause::PostmasterRestart, 7, 4_294_967_303)
        );

        let down = serve((StatusCode::SERVICE_UNAVAILABLE, r#"{"code":"UNAVAILABLE"}"#)).await;
        let e = read_sequence(&http(), &down).await.unwrap_err().to_string();
        assert!(e.contains("503") && e.contains("/v1/sequence"), "{e}");
        let odd = serve((StatusCode::OK, r#"{"backend":"postgres"}"#)).await;
        assert!(read_sequence(&http(), &odd).await.is_err());
        // Nobody listening.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(read_sequence(&http(), &closed).await.is_err());
    }
}
