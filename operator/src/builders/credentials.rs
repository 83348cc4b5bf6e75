//! The generated Secrets of credentials: lock-server's admin token ([`admin_secret`]) and the
//! payment services' bearer credentials (docs/security.md): one generated Secret per
//! PaymentStack, `<owner>-payment-credentials`, with one key per role. payment-resource and
//! rail-proxy read the credentials they accept from it, payout-executor the ones it presents, and
//! whoever creates payouts uses `client`. Created once, never rotated by reconcile, never in status,
//! Events or logs.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rand::Rng;
use rand::distr::Alphanumeric;

use super::{LOCK_SERVER, Owner, PAYMENT_RESOURCE};

/// payment-resource's `admin` role: accounts, reconciliation.
pub const KEY_ADMIN: &str = "admin";
/// payment-resource's `executor` role: claim, transitions, post.
pub const KEY_EXECUTOR: &str = "executor";
/// payment-resource's `client` role: payout creation.
pub const KEY_CLIENT: &str = "client";
/// rail-proxy's `executor` role: submissions and their resolution.
pub const KEY_RAIL_PROXY_EXECUTOR: &str = "rail-proxy-executor";

pub const KEYS: [&str; 4] = [KEY_ADMIN, KEY_EXECUTOR, KEY_CLIENT, KEY_RAIL_PROXY_EXECUTOR];

pub fn credentials_secret_name(owner: &Owner) -> String {
    owner.child("payment-credentials")
}

/// `len` random alphanumerics: every generated credential of the operator.
pub fn random_token(len: usize) -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

/// A fresh Secret with a distinct random credential per role.
pub fn credentials_secret(owner: &Owner) -> Secret {
    let data: BTreeMap<String, ByteString> = KEYS
        .iter()
        // 48 alphanumerics: ~285 bits, inside the services' 16..=512 visible-ASCII rule.
        .map(|k| ((*k).to_owned(), ByteString(random_token(48).into_bytes())))
        .collect();
    Secret {
        metadata: owner.meta(credentials_secret_name(owner), PAYMENT_RESOURCE),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Key of the admin token in [`admin_secret`].
pub const KEY_ADMIN_TOKEN: &str = "token";

/// `<owner>-lock-server-admin`: lock-server's admin bearer token (for the pinned force-revoke).
/// Created once with a random token; lock-server reads it from the environment, the operator from
/// the Secret. Never logged, never in status or Events.
pub fn admin_secret_name(owner: &Owner) -> String {
    owner.child("lock-server-admin")
}

pub fn admin_secret(owner: &Owner) -> Secret {
    let token = random_token(40);
    Secret {
        metadata: owner.meta(admin_secret_name(owner), LOCK_SERVER),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            KEY_ADMIN_TOKEN.to_owned(),
            ByteString(token.into_bytes()),
        )])),
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_gets_its_own_random_credential() {
        let owner = Owner {
            name: "payments".into(),
            namespace: "ns".into(),
            kind: "PaymentStack".into(),
            owner_ref: Default::default(),
            https: false,
        };
        let a = credentials_secret(&owner);
        let b = credentials_secret(&owner);
        assert_eq!(a.metadata.name.as_deref(), Some("payments-payment-credentials"));
        let da = a.data.unwrap();
        let db = b.data.unwrap();
        assert_eq!(da.keys().map(String::as_str).collect::<Vec<_>>().len(), 4);
        let values: std::collections::BTreeSet<_> = da.values().map(|v| v.0.clone()).collect();
        assert_eq!(values.len(), 4, "two roles share a credential");
        for k in KEYS {
            let v = &da[k].0;
            assert!(v.len() >= 16 && v.iter().all(u8::is_ascii_alphanumeric));
            assert_ne!(v, &db[k].0, "credentials are not random");
        }
    }
}
