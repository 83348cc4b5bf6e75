//! The grant keys of a LockService, planned purely: which key lock-server signs with ([`signer`]) —
//! the newest published key that every referencing PaymentStack's resources are rolled out with, so
//! the order of a rotation is the operator's, whatever the user does: a new key is verified first,
//! signed with after — and what a `dlock.dev/grant-keys` request does ([`plan`]). The objects are
//! built in [`crate::builders::grant_keys`]; the reads and the write are [`super::grants`].

use dlock_grant::{KeyId, PublicKeys, SigningKey};

use crate::actions::Request as ActionRequest;
use crate::builders::grant_keys::{Published, next_key_id};
use crate::crd::GrantStatus;
use crate::crd::actions::{GrantKeyAction, GrantKeysRequest};

/// The key lock-server signs with: the newest published key that every referencing stack that has
/// reported its rolled-out key set verifies (a stack that has not reported yet starts with the whole
/// published set, so it does not hold a switch back). When no published key qualifies (a report
/// older than the set), the current signer stays if it is still published, else the oldest key.
pub fn signer(
    published: &PublicKeys,
    stacks: &[Option<Vec<String>>],
    current: Option<&str>,
) -> Option<KeyId> {
    let verified_everywhere = |id: &KeyId| {
        stacks
            .iter()
            .flatten()
            .all(|set| set.iter().any(|k| k == id.as_str()))
    };
    let ids: Vec<&KeyId> = published.ids().collect();
    ids.iter()
        .rev()
        .find(|id| verified_everywhere(id))
        .or_else(|| ids.iter().find(|id| Some(id.as_str()) == current))
        .or_else(|| ids.first())
        .map(|id| (*id).clone())
}

/// A request of `dlock.dev/grant-keys`, as read from the annotation.
pub type Request = ActionRequest<GrantKeysRequest>;

/// The one write to the key material this reconcile makes.
#[derive(Debug, Clone)]
pub enum GrantWrite {
    /// Nothing published yet: the first key (lock-server is held until it exists).
    Publish(SigningKey),
    /// `request` adds `key`: verified by the resources first, signed with once they are rolled out.
    Add { request: String, key: SigningKey },
    /// `request` retires `key_id`: removed from the Secret, then from the published set.
    Retire { request: String, key_id: KeyId },
    /// `request` cannot be done; recorded as handled with `message`.
    Refuse { request: String, message: String },
}

/// Everything the grant-key step looked at.
#[derive(Debug, Clone, Default)]
pub struct GrantInputs {
    /// The ConfigMap, read back (`None`: not created yet; `Some(Err)`: it does not parse).
    pub published: Option<Result<Published, String>>,
    pub request: Option<Request>,
    /// Each referencing PaymentStack's rolled-out key set (`status.grants.keyIds`), `None` if it has
    /// not reported one.
    pub stacks: Vec<Option<Vec<String>>>,
    /// `status.grants.signingKeyId` as last written.
    pub current_signer: Option<String>,
    /// The key id lock-server's Deployment is rolled out with (its template annotation, only when
    /// every replica runs it).
    pub lock_server_signs_with: Option<String>,
}

/// The grant-key step's decision.
#[derive(Debug, Clone, Default)]
pub struct GrantPlan {
    /// The key lock-server signs with (`None`: nothing published yet, lock-server is held).
    pub signer: Option<KeyId>,
    pub write: Option<GrantWrite>,
    /// The published key set once `write` is made.
    pub keys_after: PublicKeys,
    /// `status.grants` after this step.
    pub status: GrantStatus,
    /// A rotation is under way (a published key is not signed with yet): look again soon.
    pub rotating: bool,
    /// The published set cannot be used (hand-edited): a human must repair or delete the ConfigMap.
    pub broken: Option<String>,
}

/// Plans the grant-key step purely: the first key, a request, and the signer.
pub fn plan(inputs: &GrantInputs) -> GrantPlan {
    let published = match &inputs.published {
        None => {
            let key = SigningKey::generate(next_key_id(&PublicKeys::default()));
            let keys_after = PublicKeys::new(vec![key.public_key()]).unwrap_or_default();
            return GrantPlan {
                signer: None,
                status: GrantStatus {
                    key_ids: vec![key.id().to_string()],
                    message: Some("generated the first grant signing key; lock-server starts with it".into()),
                    ..GrantStatus::default()
                },
                write: Some(GrantWrite::Publish(key)),
                keys_after,
                rotating: true,
                broken: None,
            };
        }
        Some(Err(e)) => {
            return GrantPlan {
                broken: Some(format!(
                    "the grant public keys ConfigMap cannot be read ({e}); restore its keys as \
                     they were (docs/operations.md)"
                )),
                ..GrantPlan::default()
            };
        }
        Some(Ok(p)) if p.keys.is_empty() => {
            return GrantPlan {
                broken: Some(
                    "the grant public keys ConfigMap publishes no key; restore its keys as they were \
                     (docs/operations.md)"
                        .into(),
                ),
                ..GrantPlan::default()
            };
        }
        Some(Ok(p)) => p,
    };
    let mut keys = published.keys.clone();
    let signer = signer(&keys, &inputs.stacks, inputs.current_signer.as_deref());
    let mut last = (published.last_request.clone(), published.last_outcome.clone());
    let mut write = None;
    let mut message = None;
    match &inputs.request {
        Some(ActionRequest::Valid(r)) if published.last_request.as_deref() != Some(&r.id) => {
            match decide(
                r,
                &keys,
                signer.as_ref(),
                inputs.lock_server_signs_with.as_deref(),
            ) {
                Decision::Write(w) => {
                    let w = *w;
                    let outcome = match &w {
                        GrantWrite::Add { key, .. } => {
                            keys = keys.clone().with(key.public_key()).unwrap_or(keys.clone());
                            format!("added {}", key.id())
                        }
                        GrantWrite::Retire { key_id, .. } => {
                            let kept = keys.iter().filter(|k| k.id() != key_id).cloned().collect();
                            keys = PublicKeys::new(kept).unwrap_or(keys.clone());
                            format!("retired {key_id}")
                        }
                        GrantWrite::Refuse { message, .. } => format!("refused: {message}"),
                        GrantWrite::Publish(_) => String::new(),
                    };
                    last = (Some(r.id.clone()), Some(outcome));
                    write = Some(w);
                }
                Decision::Wait(why) => message = Some(format!("request {}: {why}", r.id)),
            }
        }
        Some(ActionRequest::Invalid { id, error }) => {
            match id
                .as_ref()
                .filter(|id| published.last_request.as_deref() != Some(id.as_str()))
            {
                Some(id) => {
                    let message = error.to_string();
                    last = (Some(id.clone()), Some(format!("refused: {message}")));
                    write = Some(GrantWrite::Refuse {
                        request: id.clone(),
                        message,
                    });
                }
                None if id.is_none() => message = Some(error.to_string()),
                None => {}
            }
        }
        _ => {}
    }
    let newest = keys.ids().last().cloned();
    let rotating = newest.is_some() && newest != signer;
    if rotating && message.is_none() {
        message = newest.as_ref().map(|n| {
            format!(
                "{n} is published; lock-server signs with it once every PaymentStack's resources verify it"
            )
        });
    }
    GrantPlan {
        status: GrantStatus {
            key_ids: keys.ids().map(ToString::to_string).collect(),
            signing_key_id: signer.as_ref().map(ToString::to_string),
            last_request: last.0,
            last_outcome: last.1,
            message,
        },
        signer,
        write,
        keys_after: keys,
        rotating,
        broken: None,
    }
}

enum Decision {
    Write(Box<GrantWrite>),
    /// Not yet: the request stays pending and is looked at again.
    Wait(String),
}

fn decide(
    r: &GrantKeysRequest,
    keys: &PublicKeys,
    signer: Option<&KeyId>,
    lock_server: Option<&str>,
) -> Decision {
    let refuse = |message: String| {
        Decision::Write(Box::new(GrantWrite::Refuse {
            request: r.id.clone(),
            message,
        }))
    };
    match r.action {
        GrantKeyAction::Add => Decision::Write(Box::new(GrantWrite::Add {
            request: r.id.clone(),
            key: SigningKey::generate(next_key_id(keys)),
        })),
        GrantKeyAction::Retire => {
            let Some(id) = r.key_id.as_deref().and_then(KeyId::new) else {
                return refuse("retire needs keyId".into());
            };
            if keys.get(&id).is_none() {
                return refuse(format!("{id} is not a published key"));
            }
            if keys.ids().count() == 1 {
                return refuse(format!("{id} is the only key; add another first"));
            }
            if signer == Some(&id) {
                return refuse(format!(
                    "{id} is the key lock-server signs with; a newer key must be verified by every \
                     PaymentStack first (lock-server then switches to it)"
                ));
            }
            // lock-server pods still running with the retired key would sign grants nobody trusts.
            if lock_server != signer.map(KeyId::as_str) {
                return Decision::Wait(format!(
                    "waiting for lock-server to run with {} before retiring {id}",
                    signer.map(ToString::to_string).unwrap_or_default()
                ));
            }
            Decision::Write(Box::new(GrantWrite::Retire {
                request: r.id.clone(),
                key_id: id,
            }))
        }
    }
}

/// Parses the annotation (the id of a broken request is kept, to report under it).
pub fn request(raw: Option<&str>) -> Option<Request> {
    let raw = raw?;
    Some(match crate::crd::actions::parse_grant_keys(raw) {
        Ok(r) => ActionRequest::Valid(r),
        Err(error) => ActionRequest::Invalid {
            id: crate::crd::actions::id_of(raw),
            error,
        },
    })
}

#[cfg(test)]
mod tests;
