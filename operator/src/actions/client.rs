//! lock-server's API as the actions use it: `GET /v1/locks/{key}` (who holds a key, with which
//! token) and the pinned revoke `POST /v1/admin/locks/{key}/revoke` with the admin token the
//! operator generated. The one write an action makes outside Kubernetes.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

use super::revoke::{LockView, RevokeAnswer, RevokeCall};
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

/// `GET /v1/locks/{key}`: the current holder and its fencing token.
pub async fn get_lock(ctx: &Context, base: &str, key: &str) -> Result<LockView> {
    const STEP: &str = "read the current grant (GET /v1/locks/{key})";
    let url = lock_url(base, &["v1", "locks", key])?;
    let resp = ctx.http.get(url).send().await.map_err(|e| Error::LockServer {
        step: STEP,
        message: e.to_string(),
    })?;
    decode(STEP, resp).await
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
    let resp = ctx
        .http
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(|e| Error::LockServer {
            step: STEP,
            message: e.to_string(),
        })?;
    decode(STEP, resp).await
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
