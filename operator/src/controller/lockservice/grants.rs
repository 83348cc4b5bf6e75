//! The I/O of a LockService's grant keys ([`super::keys`] decides): what is read —
//! the public ConfigMap, the `dlock.dev/grant-keys` request, the referencing PaymentStacks' rolled-out
//! key sets, the key lock-server runs with — and the one write a reconcile makes to the key material.
//!
//! The signing-key Secret is only ever written (a key created, merged in, or removed by a JSON merge
//! patch that names its key id); it is never read, so no private key passes through the operator
//! but at the moment it generates one.

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::keys::{self, GrantInputs, GrantPlan, GrantWrite};
use crate::builders::grant_keys::{
    self, ANNOTATION_LAST_OUTCOME, ANNOTATION_LAST_REQUEST, KEY_SET, Published,
};
use crate::builders::{LOCK_SERVER, Owner};
use crate::context::Context;
use crate::crd::actions::ANNOTATION_GRANT_KEYS;
use crate::crd::{LockService, PaymentStack};
use crate::error::{Error, Result};
use crate::health::DeploymentHealth;
use crate::reasons::{EventNote, Reason};

fn step(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::step(what, e)
}

/// Everything the grant-key planning needs.
pub async fn observe(
    ctx: &Context,
    ls: &LockService,
    owner: &Owner,
    stacks: &[PaymentStack],
) -> Result<GrantInputs> {
    let ns = &owner.namespace;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let published = configmaps
        .get_opt(&grant_keys::public_keys_name(&owner.name))
        .await
        .map_err(step("read the grant public keys ConfigMap"))?
        .map(|cm| Published::of(&cm));
    let stacks = stacks
        .iter()
        .map(|ps| {
            ps.status
                .as_ref()
                .and_then(|s| s.grants.as_ref())
                .map(|g| g.key_ids.clone())
                .filter(|ids| !ids.is_empty())
        })
        .collect();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let lock_server = deployments
        .get_opt(&owner.child(LOCK_SERVER))
        .await
        .map_err(step("observe lock-server Deployment"))?;
    let lock_server_signs_with = lock_server
        .filter(|d| DeploymentHealth::of(d).is_available())
        .and_then(|d| {
            d.spec?
                .template
                .metadata?
                .annotations?
                .remove(grant_keys::SIGNING_KEY_ANNOTATION)
        });
    Ok(GrantInputs {
        published,
        request: keys::request(ls.annotations().get(ANNOTATION_GRANT_KEYS).map(String::as_str)),
        stacks,
        current_signer: ls
            .status
            .as_ref()
            .and_then(|s| s.grants.as_ref())
            .and_then(|g| g.signing_key_id.clone()),
        lock_server_signs_with,
    })
}

fn secret_data(key_id: &str, value: Option<&str>) -> serde_json::Value {
    // A merge patch of one data key: its base64 value, or null to remove it.
    json!({"data": {key_id: value.map(|v| ByteString(v.as_bytes().to_vec()))}})
}

/// Makes `plan`'s write, if any; the Event that says what was done.
pub async fn write(ctx: &Context, owner: &Owner, plan: &GrantPlan) -> Result<Option<EventNote>> {
    let Some(w) = &plan.write else { return Ok(None) };
    let ns = &owner.namespace;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let secret_name = grant_keys::signing_secret_name(&owner.name);
    let cm_name = grant_keys::public_keys_name(&owner.name);
    let merge = PatchParams::default();
    // The outcome the plan recorded in status is the one the ConfigMap keeps with the request.
    let outcome = plan.status.last_outcome.clone().unwrap_or_default();
    let published = |request: &str| {
        json!({
            "metadata": {"annotations": {ANNOTATION_LAST_REQUEST: request, ANNOTATION_LAST_OUTCOME: &outcome}},
            "data": {KEY_SET: plan.keys_after.to_text()},
        })
    };
    let note = |reason, warning, note: String| {
        Some(EventNote {
            reason,
            warning,
            note,
        })
    };
    Ok(match w {
        GrantWrite::Publish(key) => {
            // The private key first: until the ConfigMap exists nothing verifies or signs with it, so
            // a crash in between only means a fresh key next time (overwriting this one).
            let text = key.expose_text();
            if secrets
                .get_metadata_opt(&secret_name)
                .await
                .map_err(step("look up the grant signing-key Secret"))?
                .is_some()
            {
                secrets
                    .patch(
                        &secret_name,
                        &merge,
                        &Patch::Merge(secret_data(key.id().as_str(), Some(&text))),
                    )
                    .await
                    .map_err(step("write the first grant signing key"))?;
            } else {
                secrets
                    .create(&PostParams::default(), &grant_keys::signing_secret(owner, key))
                    .await
                    .map_err(step("create the grant signing-key Secret"))?;
            }
            configmaps
                .create(
                    &PostParams::default(),
                    &grant_keys::public_keys_configmap(owner, &plan.keys_after, None),
                )
                .await
                .map_err(step("publish the grant public keys"))?;
            note(
                Reason::GrantKeysCreated,
                false,
                format!(
                    "generated grant signing key {} (Secret {secret_name}, public key in ConfigMap {cm_name})",
                    key.id()
                ),
            )
        }
        GrantWrite::Add { request, key } => {
            let text = key.expose_text();
            secrets
                .patch(
                    &secret_name,
                    &merge,
                    &Patch::Merge(secret_data(key.id().as_str(), Some(&text))),
                )
                .await
                .map_err(step("add a grant signing key"))?;
            configmaps
                .patch(&cm_name, &merge, &Patch::Merge(published(request)))
                .await
                .map_err(step("publish the new grant public key"))?;
            note(
                Reason::GrantKeyAdded,
                false,
                format!(
                    "request {request}: generated grant signing key {}; lock-server signs with it once every PaymentStack's resources verify it",
                    key.id()
                ),
            )
        }
        GrantWrite::Retire { request, key_id } => {
            // The Secret first: a crash before the ConfigMap leaves the request unhandled, and the
            // retry removes the (already absent) key again.
            secrets
                .patch(
                    &secret_name,
                    &merge,
                    &Patch::Merge(secret_data(key_id.as_str(), None)),
                )
                .await
                .map_err(step("remove a grant signing key"))?;
            configmaps
                .patch(&cm_name, &merge, &Patch::Merge(published(request)))
                .await
                .map_err(step("withdraw a grant public key"))?;
            note(
                Reason::GrantKeyRetired,
                false,
                format!(
                    "request {request}: retired grant key {key_id}; grants it signed are refused once the resources roll"
                ),
            )
        }
        GrantWrite::Refuse { request, message } => {
            configmaps
                .patch(&cm_name, &merge, &Patch::Merge(published(request)))
                .await
                .map_err(step("record a refused grant-key request"))?;
            note(
                Reason::GrantKeyRequestRefused,
                true,
                format!("request {request}: {message}"),
            )
        }
    })
}
